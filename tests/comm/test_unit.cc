// Pieces of comm/ that need no peers: the wire check, the chunk layout, the
// pause of the waits for the GPU, and the structural rule that algorithms
// include no transport header; the status board's diagnosis when the store
// stops answering.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <thread>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "comm/algorithms/algorithms.h"
#include "comm/poll_pause.h"
#include "comm/status.h"
#include "comm/wire.h"
#include "runtime/store.h"
#include "tools/bench/verify.h"

using namespace braid;
using namespace braid::comm;

TEST_CASE("header check names both calls on a mismatch") {
  Op mine{OpKind::all_reduce, nullptr, nullptr, 1024, DataType::f32, ReduceOp::sum, -1, 812, {}, {}};
  Op theirs{OpKind::all_gather, nullptr, nullptr, 1024, DataType::f32, ReduceOp::sum, -1, 812, {}, {}};
  auto expected = expected_header(7, mine, 1, 2, 0, 0, 64);
  auto got = make_header(7, theirs, 2, 1, 0, 0, 64);
  std::string text = header_mismatch(expected, got, 1, 2);
  CHECK_THAT(text, Catch::Contains("rank 1 called all_reduce #812"));
  CHECK_THAT(text, Catch::Contains("rank 2 called all_gather #812"));
  CHECK(header_mismatch(expected, make_header(7, mine, 2, 1, 0, 0, 64), 1, 2).empty());
  auto garbage = got;
  garbage.magic = 0x12345678;
  CHECK_THAT(header_mismatch(expected, garbage, 1, 2), Catch::Contains("not a braid message header"));
  auto other_comm = make_header(8, mine, 2, 1, 0, 0, 64);
  CHECK_THAT(header_mismatch(expected, other_comm, 1, 2), Catch::Contains("another communicator"));
  Op bigger = mine;
  bigger.count = 2048;
  CHECK_THAT(header_mismatch(expected, make_header(7, bigger, 2, 1, 0, 0, 64), 1, 2), Catch::Contains("count 2048"));
}

// Every message carries the algorithm that runs its call: the same call
// run with another algorithm (BRAID_ALGO, registered buffers differing
// across ranks) is named as such, with both algorithms.
TEST_CASE("headers name the algorithms of ranks that chose differently") {
  for (const char* name : {"ring", "recursive_doubling", "direct", "oneshot", "binomial", "pipelined", "pairwise",
                           "dissemination"}) {
    REQUIRE(algorithm_id(name) != 0);
    CHECK(algorithm_name(algorithm_id(name)) == name);
  }
  CHECK(algorithm_id("cuda_ipc") == algorithm_id("direct"));
  CHECK(algorithm_id("no such algorithm") == 0);
  Op mine{OpKind::broadcast, nullptr, nullptr, 64, DataType::f32, ReduceOp::sum, 0, 9, {}, {}};
  mine.algorithm = algorithm_id("binomial");
  Op theirs = mine;
  theirs.algorithm = algorithm_id("pipelined");
  const std::string text = header_mismatch(expected_header(3, mine, 1, 0, 0, 0, 256), make_header(3, theirs, 0, 1, 0, 0, 256), 1, 0);
  CHECK_THAT(text, Catch::Contains("mismatched collectives: rank 1 runs broadcast #9") &&
                       Catch::Contains("with binomial, rank 0 with pipelined") && Catch::Contains("BRAID_ALGO"));
  CHECK(header_mismatch(expected_header(3, mine, 1, 0, 0, 0, 256), make_header(3, mine, 0, 1, 0, 0, 256), 1, 0).empty());
}

TEST_CASE("point-to-point headers match send against recv") {
  Op send{OpKind::send, nullptr, nullptr, 10, DataType::i32, ReduceOp::sum, 3, 5, {}, {}};
  Op recv{OpKind::recv, nullptr, nullptr, 10, DataType::i32, ReduceOp::sum, 0, 5, {}, {}};
  auto sent = make_header(1, send, 0, 3, 0, 0, 40);
  CHECK(header_mismatch(expected_header(1, recv, 3, 0, 0, 0, 40), sent, 3, 0).empty());
  Op wrong = recv;
  wrong.count = 11;
  CHECK_THAT(header_mismatch(expected_header(1, wrong, 3, 0, 0, 0, 40), sent, 3, 0),
             Catch::Contains("rank 3 called recv #5 (count 11, i32, peer 0)"));
  // A receive that meets a collective's message is still named a receive
  // (it was named "send #5 ... peer 3", the form the wire check expects).
  Op barrier{OpKind::barrier, nullptr, nullptr, 0, DataType::u8, ReduceOp::sum, -1, 6, {}, {}};
  const std::string text = header_mismatch(expected_header(1, recv, 3, 0, 0, 0, 40), make_header(1, barrier, 0, 3, 0, 0, 0), 3, 0);
  CHECK_THAT(text, Catch::Contains("rank 3 called recv #5 (count 10, i32, peer 0) but rank 0 called barrier #6"));
}

// wait_for_event's pause (comm/poll_pause.h): an eighth of the time waited,
// 5 us to 100 us, at a timer slack of 1 us while it waits, the thread's own
// slack back after; a thread whose slack is already that fine keeps it.
TEST_CASE("the pause of a wait for the GPU grows with the wait and sleeps at a fine timer slack") {
  using std::chrono::microseconds;
  CHECK(PollPause::sleep_after(microseconds(0)) == microseconds(5));
  CHECK(PollPause::sleep_after(microseconds(40)) == microseconds(5));
  CHECK(PollPause::sleep_after(microseconds(256)) == microseconds(32));
  CHECK(PollPause::sleep_after(microseconds(800)) == microseconds(100));
  CHECK(PollPause::sleep_after(std::chrono::seconds(3)) == microseconds(100));

  const int before = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  REQUIRE(prctl(PR_SET_TIMERSLACK, 50'000UL, 0, 0, 0) == 0);
  {
    PollPause pause;
    CHECK(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == 50'000);  // a wait that never pauses sets nothing
    const auto start = Clock::now();
    pause();
    CHECK(Clock::now() - start >= microseconds(5));
    CHECK(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == 1000);
    pause();
    CHECK(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == 1000);
  }
  CHECK(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == 50'000);
  REQUIRE(prctl(PR_SET_TIMERSLACK, 200UL, 0, 0, 0) == 0);
  {
    PollPause pause;
    pause();
    CHECK(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == 200);
  }
  CHECK(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) == 200);
  prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(before), 0, 0, 0);
}

TEST_CASE("chunk layout covers every element once") {
  for (std::size_t count : {0, 1, 7, 100, 1009})
    for (int parts = 1; parts <= 8; ++parts) {
      ChunkLayout layout{count, parts};
      std::size_t total = 0;
      for (int c = 0; c < parts; ++c) {
        REQUIRE(layout.offset(c) == total);
        total += layout.count_of(c);
      }
      REQUIRE(total == count);
    }
}

// The reading half of the boundary (the building half: BRAID_ALGORITHMS_BUILD
// and comm/algorithms/boundary.h). Quoted includes: the algorithms' own
// headers, kernels, comm/types.h and runtime/errors.h. Angle brackets: the
// C++ standard library only, so no <sys/socket.h>, <sys/mman.h>,
// <infiniband/verbs.h>, <cuda_runtime.h>, <unistd.h> ...
TEST_CASE("algorithms include no transport header and no system header") {
  const char* root = BRAID_SOURCE_ROOT;
  std::regex quoted(R"(#\s*include\s+"([^"]+)\")"), angled(R"(#\s*include\s+<([^>]+)>)");
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(root) / "comm" / "algorithms")) {
    std::ifstream in(entry.path());
    std::string line;
    ++files;
    while (std::getline(in, line)) {
      std::smatch m;
      if (std::regex_search(line, m, quoted)) {
        const std::string header = m[1];
        INFO(entry.path().string() << " includes \"" << header << '"');
        CHECK((header.rfind("comm/algorithms/", 0) == 0 || header.rfind("kernels/", 0) == 0 ||
               header == "comm/types.h" || header == "runtime/errors.h"));
      } else if (std::regex_search(line, m, angled)) {
        const std::string header = m[1];
        INFO(entry.path().string() << " includes <" << header << '>');
        CHECK(header.find('/') == std::string::npos);  // no sys/, netinet/, infiniband/, linux/ ...
        CHECK(header.find(".h") == std::string::npos);   // no C or vendor headers (unistd.h, cuda.h ...)
      }
    }
  }
  CHECK(files >= 10);
}

// braid-bench's expected values (tools/bench/verify.h) must tell a result
// from the same result moved by one element, or by a slice of any count: the
// prod inputs made every product 2, so a shifted prod result passed the
// check; inputs of (rank + index) % 7 made the slices of a reduce_scatter of
// a count that is a multiple of 7 alike, and at 7 ranks every sum the same.
TEST_CASE("the bench's expected reductions differ between neighbouring elements and slices for every op") {
  const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max,
                          ReduceOp::avg, ReduceOp::band, ReduceOp::bor, ReduceOp::bxor};
  for (int size : {2, 3, 4, 5, 7, 8, 14, 16, 21, 32, 64})
    for (ReduceOp op : ops)
      for (DataType dtype : {DataType::f32, DataType::i8, DataType::u8, DataType::bf16}) {
        if (is_bitwise(op) && (dtype == DataType::f32 || dtype == DataType::bf16)) continue;
        if (op == ReduceOp::prod && size > 8) continue;  // ranks 1 to 6 give the factors
        // An integer avg of many ranks truncates to about 1 (verify.cc).
        if (op == ReduceOp::avg && size > 32 && (dtype == DataType::i8 || dtype == DataType::u8)) continue;
        INFO(size << " ranks, op " << static_cast<int>(op) << ", dtype " << static_cast<int>(dtype));
        const verify::ExpectedTable table(size, dtype, op);
        const std::size_t es = table.element_bytes();
        auto same = [&](std::size_t a, std::size_t b) {
          return std::memcmp(table.reduction(a), table.reduction(b), es) == 0;
        };
        bool neighbours_differ = false;
        for (std::size_t i = 0; i + 1 < 7; ++i) neighbours_differ |= !same(i, i + 1);
        CHECK(neighbours_differ);
        for (std::size_t count : {std::size_t{7}, std::size_t{21}, std::size_t{31}, std::size_t{1024}}) {
          bool slices_differ = false;
          for (std::size_t i = 0; i < count; ++i) slices_differ |= !same(i, count + i);
          INFO("count " << count);
          CHECK(slices_differ);
        }
        // braid-bench fills its inputs from the table: the same bytes.
        const std::size_t count = 2 * verify::input_period() + 5;
        std::vector<std::byte> direct(count * es), tabled(count * es);
        verify::fill_input(direct.data(), count, 0, size - 1, size, dtype, op);
        table.fill_input(tabled.data(), count, size - 1);
        CHECK(direct == tabled);
        // The marker braid-bench leaves outside the output is no result.
        if (dtype == DataType::u8 && !is_bitwise(op))
          for (std::size_t i = 0; i < verify::input_period(); ++i)
            CHECK(std::to_integer<int>(*table.reduction(i)) != 0xa5);
      }
}

// holder() watches the peers' heartbeats for 500 ms; a store that stopped
// answering in that time (its server, rank 0 without a launcher, died)
// left the timeout's message without its last clause, without a word.
TEST_CASE("the status board says the holder is not known when the store stops answering while it watches") {
  using namespace std::chrono_literals;
  auto server = std::make_unique<runtime::StoreServer>("127.0.0.1", 0, "status-token");
  auto store = std::make_shared<runtime::Store>("127.0.0.1", server->port(), "status-token", 5s);
  store->set_request_timeout(2s);
  StatusBoard board(store, "unit", 0, 2);
  Op op;
  op.kind = OpKind::all_reduce;
  op.seq = 1;
  std::thread stop([&] {
    std::this_thread::sleep_for(200ms);
    server.reset();
  });
  const auto start = std::chrono::steady_clock::now();
  const std::string said = board.holder(op, 2);
  stop.join();
  CHECK_THAT(said, Catch::StartsWith("not known: "));
  CHECK(std::chrono::steady_clock::now() - start < 4s);
  // Asked again, the board does not wait on the store: describe_peer names it.
  CHECK(board.holder(op, 2).empty());
  CHECK_THAT(board.describe_peer(1, 1), Catch::StartsWith("could not be asked: the store did not answer"));
}

// A peer that published no abort reason, but whose set-up failed after its
// peers had finished theirs (they saw its connections close), is explained
// by the set-up failure published for the communicator (helper-133's F2:
// the job's whole output said "rank 5 closed its communicator, or exited").
TEST_CASE("the status board gives a peer's set-up failure where it published no abort reason") {
  using namespace std::chrono_literals;
  runtime::StoreServer server("127.0.0.1", 0, "status-token");
  auto store = std::make_shared<runtime::Store>("127.0.0.1", server.port(), "status-token", 5s);
  StatusBoard board(store, "unit", 0, 3);
  CHECK(board.abort_reason(2).empty());
  store->set(setup_failed_key("unit"), "2|rank 2 cannot listen for TCP peers on 10.255.255.1");
  CHECK(board.abort_reason(2) == "rank 2 cannot listen for TCP peers on 10.255.255.1");
  // Another rank's failure is named as its own: rank 1 may have closed on it.
  CHECK(board.abort_reason(1) == "rank 2 cannot listen for TCP peers on 10.255.255.1");
  store->set(setup_failed_key("unit"), "2|BRAID_TCP_NSOCKS differs between ranks");
  CHECK(board.abort_reason(1) == "rank 2 could not set up this communicator: BRAID_TCP_NSOCKS differs between ranks");
  // An abort reason comes first.
  store->set("unit/abort/1", "rank 1 aborted: out of memory");
  CHECK(board.abort_reason(1) == "rank 1 aborted: out of memory");
}
