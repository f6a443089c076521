// One-shot barrier through the shared slots (oneshot.h): every rank
// publishes its signature and waits until every other rank has published
// this call. One flag per rank, written once and read by every peer,
// instead of ceil(log2 N) dissemination rounds of messages.
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/oneshot.h"

namespace braid::comm {

void barrier_oneshot(Exchange& x) { share_slots(x, nullptr, 0); }

}  // namespace braid::comm
