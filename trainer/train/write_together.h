// Collective writes that wait for a slow disk, not for a stuck one.
//
// A sharded save must have every rank's shard on disk before rank 0
// publishes the step. A barrier there counted the slowest disk against
// BRAID_TIMEOUT: a rank still writing gigabytes to network storage when the
// timeout ran out failed the barrier on every other rank, and the
// checkpoint was lost. write_together runs this rank's write on a thread of
// its own while this thread meets the peers every tick (an all_gather of
// each rank's state and durable bytes, WriteProgress): the wait lasts as
// long as some unfinished rank's byte count moves, and fails on every rank
// alike once none has moved for the communicator's timeout. A writer that
// has published its files and goes on to remove what they replace
// (WriteProgress::published: rank 0 pruning older checkpoint steps) moves
// as it removes them, and a stall there is told apart: the write stands.
#pragma once

#include <functional>
#include <string>

#include "comm/communicator.h"
#include "trainer/checkpoint/atomic_file.h"

namespace braid::trainer {

// Runs `write` (this rank's part, which reports to the WriteProgress it is
// given and stops when that asks it to) and returns once every rank's has
// ended. Collective over `comm`. Throws on every rank when one failed (that
// rank its own error, the others a SystemError naming it), and a
// TimeoutError naming the ranks still writing, with the bytes each has
// written, when none has made progress for comm.timeout(). `what` names the
// write in messages ("the shards of step 100").
void write_together(comm::Communicator& comm, const std::string& what,
                    const std::function<void(WriteProgress&)>& write);

}  // namespace braid::trainer
