// Dissemination rounds: in round k rank r signals rank (r + 2^k) mod N and
// waits for rank (r - 2^k) mod N, with header-only messages. A rank sends
// round k only after round k-1 arrived, so after ceil(log2 N) rounds every
// rank has transitively heard from every other.
//
// Two uses of the same rounds:
// - the barrier: no rank leaves before all have entered;
// - signature agreement before a collective: every header carries the
//   sender's whole call (kind, count, dtype, op, root, sequence number) and
//   is checked on arrival, so a rank that completes the rounds knows, through
//   a chain of checks, that every rank called the same thing. A mismatch
//   fails at least the ranks that see it, and their abort fails the rest,
//   before any user buffer was written. Algorithms whose own schedule already
//   proves this before their first write skip it (Algorithm::agrees). On
//   a few ranks, one round of headers between every pair does the same,
//   and on a communicator with shared slots (one host over shm) one
//   published slot per rank does (oneshot.h).
#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/oneshot.h"

namespace braid::comm {
namespace {

// Steps no data-moving schedule uses, so a rank that skipped agreement (it
// chose another algorithm because its arguments differ) fails on a header
// that names both calls.
constexpr std::uint32_t kAgreementStep = 0x7ffe0000u;

void dissemination_rounds(Exchange& x, std::uint32_t first_step) {
  const int n = x.size(), r = x.rank();
  for (std::uint32_t k = 0, distance = 1; static_cast<int>(distance) < n; ++k, distance *= 2) {
    Request sent = x.send((r + static_cast<int>(distance)) % n, first_step + k, 0, nullptr, 0);
    x.wait(x.recv((r - static_cast<int>(distance) + n) % n, first_step + k, 0, nullptr, 0));
    x.wait(sent);
  }
}

}  // namespace

void barrier_dissemination(Exchange& x) { dissemination_rounds(x, 0); }

// Up to this many ranks every rank sends its header to every other and
// checks all of theirs: one round, whose messages all leave at once, instead
// of ceil(log2 N) rounds that each wait for the last (a sleep and a wake-up
// each when ranks outnumber cores).
constexpr int kAllPairsAgreementRanks = 8;

void agree_signatures(Exchange& x) {
  if (x.slot_capacity() > 0) return agree_through_slots(x);
  if (x.size() > kAllPairsAgreementRanks) return dissemination_rounds(x, kAgreementStep);
  x.swap_with_all(kAgreementStep, nullptr, nullptr, 0);
}

}  // namespace braid::comm
