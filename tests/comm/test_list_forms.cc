// all_gather into one buffer per rank (Communicator::all_gather's list form,
// torch's dist.all_gather into a list of tensors): the ring and one-shot
// write each rank's part straight into its buffer, where the torch backend
// gathered into a staging block and copied every part out (2x the flat
// form's time at 16 MiB per rank).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/errors.h"
#include "tests/comm/harness.h"

using namespace braid;
using namespace braid::comm;
using braid::test::expect;

namespace {

float value(int rank, std::size_t i, int call) {
  return static_cast<float>(static_cast<int>((rank * 131 + i * 7 + static_cast<std::size_t>(call) * 3) % 1009) - 500);
}

// A send buffer of `count` floats and a flat output of 2 x count, both in
// registered memory (Communicator::allocate), freed with the scope.
struct RegisteredPair {
  explicit RegisteredPair(std::size_t count)
      : send(static_cast<float*>(Communicator::allocate(count * sizeof(float)))),
        out(static_cast<float*>(Communicator::allocate(2 * count * sizeof(float)))) {}
  ~RegisteredPair() {
    Communicator::deallocate(send);
    Communicator::deallocate(out);
  }
  RegisteredPair(const RegisteredPair&) = delete;
  RegisteredPair& operator=(const RegisteredPair&) = delete;
  float* send;
  float* out;
};

}  // namespace

// Each rank picks its own form: rank 0 the flat form, rank 1 the list out
// of place, rank 2 the list in place (its send buffer is its own part),
// all in one call. Three calls are issued before any is waited for, each
// with a table that is gone by then. Counts that run one-shot (small, on
// shm) and the ring (large; over TCP every count runs the ring).
TEST_CASE("all_gather into one buffer per rank is exact, in place or not, beside ranks on the flat form",
          "[collectives][list]") {
  const std::string transport = GENERATE(std::string("shm"), std::string("tcp"));
  const int size = GENERATE(2, 3);
  const std::size_t count = GENERATE(std::size_t{1}, std::size_t{1000}, std::size_t{70001});
  runtime::Config config = test::test_config();
  config.transport = transport;
  auto result = test::run_ranks(size, [count](Communicator& comm) {
    const int n = comm.size(), r = comm.rank();
    constexpr int kCalls = 3;
    std::vector<std::vector<float>> flat(kCalls), send(kCalls);
    std::vector<std::vector<std::unique_ptr<float[]>>> parts(kCalls);
    std::vector<Work> works;
    for (int call = 0; call < kCalls; ++call) {
      send[call].resize(count);
      for (std::size_t i = 0; i < count; ++i) send[call][i] = value(r, i, call);
      if (r == 0) {
        flat[call].assign(count * n, -1.0f);
        works.push_back(comm.all_gather(send[call].data(), flat[call].data(), count, DataType::f32));
        continue;
      }
      std::vector<void*> table;  // destroyed before the call is waited for
      for (int k = 0; k < n; ++k) {
        parts[call].push_back(std::make_unique<float[]>(count));
        std::fill_n(parts[call].back().get(), count, -1.0f);
        table.push_back(parts[call].back().get());
      }
      const float* input = send[call].data();
      if (r == 2) {  // in place: the input is its own part
        std::copy_n(input, count, parts[call][r].get());
        input = parts[call][r].get();
      }
      works.push_back(comm.all_gather(input, table, count, DataType::f32));
    }
    for (Work& w : works) w.wait();
    for (int call = 0; call < kCalls; ++call)
      for (int k = 0; k < n; ++k) {
        const float* got = r == 0 ? flat[call].data() + k * count : parts[call][k].get();
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) wrong += got[i] != value(k, i, call);
        expect(wrong == 0, "call " + std::to_string(call) + ", rank " + std::to_string(k) + "'s part: " +
                               std::to_string(wrong) + " of " + std::to_string(count) + " elements wrong");
      }
    if (r != 0) {
      const std::string algorithm = comm.last_algorithm(OpKind::all_gather).name;
      expect(algorithm == "ring" || algorithm == "oneshot", "ran " + algorithm);
    }
  }, test::run_options(std::chrono::seconds(120), config));
  INFO(transport << ", " << size << " ranks, count " << count << "\n" << result.summary());
  REQUIRE(result.all_ok());
  CHECK(result.leftover_shm == 0);
}

// Arguments the list form cannot run are refused in the call, on the rank
// that passed them, before anything moves: the ranks then go on with a
// good call on the same communicator.
TEST_CASE("the list form of all_gather refuses a wrong table, a null, overlapping or misplaced buffer",
          "[collectives][list]") {
  auto result = test::run_ranks(2, [](Communicator& comm) {
    const int r = comm.rank();
    const std::size_t count = 64;
    std::vector<float> send(count, static_cast<float>(r + 1)), a(count), b(count), both(2 * count);
    auto refused = [&](std::vector<void*> table, const void* input, const std::string& says) {
      try {
        comm.all_gather(input, table, count, DataType::f32);
      } catch (const InvalidUsage& e) {
        expect(std::string(e.what()).find(says) != std::string::npos, std::string("message: ") + e.what());
        return;
      }
      expect(false, "not refused: " + says);
    };
    refused({a.data()}, send.data(), "1 receive buffers for a communicator of 2 ranks");
    refused({a.data(), nullptr}, send.data(), "receive buffer 1 is null with count > 0");
    refused({both.data(), both.data() + count / 2}, send.data(), "receive buffers 0 and 1 overlap");
    refused({a.data(), a.data()}, send.data(), "receive buffers 0 and 1 overlap");
    // the send buffer as another rank's part, or half over its own
    refused({r == 0 ? a.data() : send.data(), r == 0 ? send.data() : a.data()}, send.data(),
            "overlaps the send buffer; only this rank's own");
    refused({both.data(), both.data() + count}, both.data() + count / 2, "overlaps the send buffer");
    // and a good one after them
    comm.all_gather(send.data(), std::vector<void*>{a.data(), b.data()}, count, DataType::f32).wait();
    expect(a[0] == 1.0f && a[count - 1] == 1.0f && b[0] == 2.0f && b[count - 1] == 2.0f, "the good call's parts");
  }, test::run_options(std::chrono::seconds(60), test::test_config()));
  INFO(result.summary());
  REQUIRE(result.all_ok());
}

// Under BRAID_ALGO=direct with registered buffers the flat form runs the
// direct collective; the list form, whose parts the peers cannot map as one
// region, runs the ring on every rank that passes it.
TEST_CASE("the list form of all_gather runs the ring where the flat form would go direct", "[collectives][list]") {
  runtime::Config config = test::test_config();
  config.algo = "direct";
  auto result = test::run_ranks(2, [](Communicator& comm) {
    const int r = comm.rank();
    const std::size_t count = 5000;
    const RegisteredPair buffers(count);
    float *send = buffers.send, *out = buffers.out;
    std::fill_n(send, count, static_cast<float>(r + 1));
    comm.all_gather(send, out, count, DataType::f32).wait();
    expect(comm.last_algorithm(OpKind::all_gather).name == "direct", "flat form: " + comm.last_algorithm(OpKind::all_gather).name);
    std::vector<float> a(count), b(count);
    comm.all_gather(send, std::vector<void*>{a.data(), b.data()}, count, DataType::f32).wait();
    expect(comm.last_algorithm(OpKind::all_gather).name == "ring", "list form: " + comm.last_algorithm(OpKind::all_gather).name);
    expect(a[count - 1] == 1.0f && b[count - 1] == 2.0f && out[count] == 2.0f, "results");
  }, test::run_options(std::chrono::seconds(60), config));
  INFO(result.summary());
  REQUIRE(result.all_ok());
}

// So a rank on the flat form of registered buffers under BRAID_ALGO=direct
// runs direct while a rank on the list form runs the ring: the call fails
// on both as mismatched (a review helper's find), and the message says why,
// where it told to register buffers that were all registered.
TEST_CASE("flat and list forms of all_gather under BRAID_ALGO=direct fail both ranks, naming the list form",
          "[collectives][list]") {
  runtime::Config config = test::test_config(std::chrono::seconds(20));
  config.algo = "direct";
  auto result = test::run_ranks(2, [](Communicator& comm) {
    const int r = comm.rank();
    const std::size_t count = 5000;
    const RegisteredPair buffers(count);
    float *send = buffers.send, *out = buffers.out;
    std::string message = "no error";
    try {
      if (r == 0) comm.all_gather(send, out, count, DataType::f32).wait();
      else comm.all_gather(send, std::vector<void*>{out, out + count}, count, DataType::f32).wait();
    } catch (const Error& e) {
      message = e.what();
    }
    expect(message.find("mismatched collectives") != std::string::npos &&
               message.find("the list form) never runs direct") != std::string::npos,
           "message: " + message);
  }, test::run_options(std::chrono::seconds(60), config));
  INFO(result.summary());
  REQUIRE(result.all_ok());
}
