// all_gather into one buffer per rank (Communicator::all_gather's list form,
// torch's dist.all_gather into a list of tensors): the ring and one-shot
// write each rank's part straight into its buffer, where the torch backend
// gathered into a staging block and copied every part out (2x the flat
// form's time at 16 MiB per rank). And reduce_scatter from one buffer per
// rank (torch's dist.reduce_scatter of a list), whose ring reads each
// rank's input from its own buffer, where the backend flattened them into
// a staging block first.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/reduce.h"
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

// Two ranks under BRAID_ALGO=direct, each given a pair of registered
// buffers of 5000 floats (RegisteredPair); every rank must end well.
void on_two_ranks_direct(const std::function<void(Communicator&, const RegisteredPair&)>& body) {
  runtime::Config config = test::test_config(std::chrono::seconds(20));
  config.algo = "direct";
  auto result = test::run_ranks(2, [&](Communicator& comm) {
    const RegisteredPair buffers(5000);
    body(comm, buffers);
  }, test::run_options(std::chrono::seconds(60), config));
  INFO(result.summary());
  REQUIRE(result.all_ok());
}

// `call` fails as a mismatch whose message names the list form.
void expect_list_form_mismatch(const std::function<void()>& call) {
  std::string message = "no error";
  try {
    call();
  } catch (const Error& e) {
    message = e.what();
  }
  expect(message.find("mismatched collectives") != std::string::npos &&
             message.find("the list form) never runs direct") != std::string::npos,
         "message: " + message);
}

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
  on_two_ranks_direct([](Communicator& comm, const RegisteredPair& buffers) {
    const int r = comm.rank();
    const std::size_t count = 5000;
    float *send = buffers.send, *out = buffers.out;
    std::fill_n(send, count, static_cast<float>(r + 1));
    comm.all_gather(send, out, count, DataType::f32).wait();
    expect(comm.last_algorithm(OpKind::all_gather).name == "direct", "flat form: " + comm.last_algorithm(OpKind::all_gather).name);
    std::vector<float> a(count), b(count);
    comm.all_gather(send, std::vector<void*>{a.data(), b.data()}, count, DataType::f32).wait();
    expect(comm.last_algorithm(OpKind::all_gather).name == "ring", "list form: " + comm.last_algorithm(OpKind::all_gather).name);
    expect(a[count - 1] == 1.0f && b[count - 1] == 2.0f && out[count] == 2.0f, "results");
  });
}

// So a rank on the flat form of registered buffers under BRAID_ALGO=direct
// runs direct while a rank on the list form runs the ring: the call fails
// on both as mismatched (a review helper's find), and the message says why,
// where it told to register buffers that were all registered.
TEST_CASE("flat and list forms of all_gather under BRAID_ALGO=direct fail both ranks, naming the list form",
          "[collectives][list]") {
  on_two_ranks_direct([](Communicator& comm, const RegisteredPair& buffers) {
    const std::size_t count = 5000;
    float *send = buffers.send, *out = buffers.out;
    expect_list_form_mismatch([&] {
      if (comm.rank() == 0) comm.all_gather(send, out, count, DataType::f32).wait();
      else comm.all_gather(send, std::vector<void*>{out, out + count}, count, DataType::f32).wait();
    });
  });
}

// The reduce_scatter list form, as the all_gather one above: rank 0 on the
// flat form, rank 1 the list out of place, rank 2 the list in place (its
// output is its own input) with its other inputs one shared buffer (inputs
// are only read). Integer values, so every order of the sum is exact.
TEST_CASE("reduce_scatter from one buffer per rank is exact, in place or not, beside ranks on the flat form",
          "[collectives][list]") {
  const std::string transport = GENERATE(std::string("shm"), std::string("tcp"));
  const int size = GENERATE(2, 3);
  const std::size_t count = GENERATE(std::size_t{1}, std::size_t{1000}, std::size_t{70001});
  runtime::Config config = test::test_config();
  config.transport = transport;
  auto result = test::run_ranks(size, [count](Communicator& comm) {
    const int n = comm.size(), r = comm.rank();
    constexpr int kCalls = 3;
    // Rank k's input for rank j's part, element i: the same value on every
    // rank that shares one buffer among its inputs (rank 2's are all that
    // of part 0, but its own).
    auto input = [&](int k, int j, std::size_t i, int call) {
      if (k == 2 && j != 2) j = 0;
      return value(k * 10 + j, i, call);
    };
    std::vector<std::vector<float>> flat(kCalls), out(kCalls);
    std::vector<std::vector<std::unique_ptr<float[]>>> parts(kCalls);
    std::vector<Work> works;
    for (int call = 0; call < kCalls; ++call) {
      out[call].assign(count, -1.0f);
      if (r == 0) {
        flat[call].resize(count * n);
        for (int j = 0; j < n; ++j)
          for (std::size_t i = 0; i < count; ++i) flat[call][j * count + i] = input(r, j, i, call);
        works.push_back(comm.reduce_scatter(flat[call].data(), out[call].data(), count, DataType::f32, ReduceOp::sum));
        continue;
      }
      std::vector<const void*> table;  // destroyed before the call is waited for
      for (int j = 0; j < n; ++j) {
        parts[call].push_back(std::make_unique<float[]>(count));
        for (std::size_t i = 0; i < count; ++i) parts[call][j][i] = input(r, j, i, call);
        table.push_back(r == 2 && j != 2 ? parts[call][0].get() : parts[call][j].get());
      }
      float* output = r == 2 ? parts[call][r].get() : out[call].data();  // rank 2: in place
      works.push_back(comm.reduce_scatter(table, output, count, DataType::f32, ReduceOp::sum));
    }
    for (Work& w : works) w.wait();
    for (int call = 0; call < kCalls; ++call) {
      const float* got = r == 2 ? parts[call][r].get() : out[call].data();
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        float sum = 0;
        for (int k = 0; k < n; ++k) sum += input(k, r, i, call);
        wrong += got[i] != sum;
      }
      expect(wrong == 0, "call " + std::to_string(call) + ": " + std::to_string(wrong) + " of " +
                             std::to_string(count) + " elements wrong");
      if (r == 2)  // the inputs it shares and reads are as they were
        for (std::size_t i = 0; i < count; ++i)
          if (parts[call][0][i] != input(r, 0, i, call)) expect(false, "rank 2's shared input changed");
    }
    const std::string algorithm = comm.last_algorithm(OpKind::reduce_scatter).name;
    expect(algorithm == "ring", "ran " + algorithm);
  }, test::run_options(std::chrono::seconds(120), config));
  INFO(transport << ", " << size << " ranks, count " << count << "\n" << result.summary());
  REQUIRE(result.all_ok());
  CHECK(result.leftover_shm == 0);
}

// The list form gives the flat form's bits, for the reductions that round
// and the avg of halves, which the ring scales as it reads each input:
// every rank runs both forms on the same values and compares.
TEST_CASE("reduce_scatter's list form gives the flat form's bits for avg of halves, f32 avg and max",
          "[collectives][list]") {
  const DataType dtype = GENERATE(DataType::f16, DataType::bf16, DataType::f32);
  const ReduceOp op = GENERATE(ReduceOp::avg, ReduceOp::max);
  auto result = test::run_ranks(3, [dtype, op](Communicator& comm) {
    const int n = comm.size(), r = comm.rank();
    const std::size_t count = 40000, es = dtype_bytes(dtype);
    std::vector<std::byte> flat(count * n * es), a(count * es), b(count * es);
    for (std::size_t i = 0; i < count * n; ++i) {
      const float v = value(r, i, 0) * 0.37f;
      if (dtype == DataType::f32) std::memcpy(&flat[i * es], &v, es);
      const std::uint16_t h =
          dtype == DataType::f16 ? kernels::cpu::f32_to_f16(v * 50.0f) : kernels::cpu::f32_to_bf16(v);
      if (dtype != DataType::f32) std::memcpy(&flat[i * es], &h, es);
    }
    comm.reduce_scatter(flat.data(), a.data(), count, dtype, op).wait();
    std::vector<std::vector<std::byte>> parts;
    std::vector<const void*> table;
    for (int j = 0; j < n; ++j) parts.emplace_back(flat.begin() + j * count * es, flat.begin() + (j + 1) * count * es);
    for (auto& part : parts) table.push_back(part.data());
    comm.reduce_scatter(table, b.data(), count, dtype, op).wait();
    expect(a == b, "the list form's result differs from the flat form's");
  }, test::run_options(std::chrono::seconds(60), test::test_config()));
  INFO(name(dtype) << " " << name(op) << "\n" << result.summary());
  REQUIRE(result.all_ok());
}

TEST_CASE("the list form of reduce_scatter refuses a wrong table, a null or an input over the output",
          "[collectives][list]") {
  auto result = test::run_ranks(2, [](Communicator& comm) {
    const int r = comm.rank();
    const std::size_t count = 64;
    std::vector<float> a(count, 1.0f), b(count, 2.0f), out(count), both(2 * count);
    auto refused = [&](std::vector<const void*> table, float* output, const std::string& says) {
      try {
        comm.reduce_scatter(table, output, count, DataType::f32, ReduceOp::sum);
      } catch (const InvalidUsage& e) {
        expect(std::string(e.what()).find(says) != std::string::npos, std::string("message: ") + e.what());
        return;
      }
      expect(false, "not refused: " + says);
    };
    refused({a.data()}, out.data(), "1 send buffers for a communicator of 2 ranks");
    refused({a.data(), nullptr}, out.data(), "send buffer 1 is null with count > 0");
    // the output as another rank's input, or half over its own
    refused({r == 0 ? a.data() : out.data(), r == 0 ? out.data() : a.data()}, out.data(),
            "overlaps the receive buffer; only this rank's own");
    refused({both.data(), both.data() + count}, both.data() + r * count + count / 2, "overlaps the receive buffer");
    // and a good one after them, with one buffer as both inputs
    comm.reduce_scatter(std::vector<const void*>{b.data(), b.data()}, out.data(), count, DataType::f32, ReduceOp::sum)
        .wait();
    expect(out[0] == 4.0f && out[count - 1] == 4.0f && b[0] == 2.0f, "the good call's result");
  }, test::run_options(std::chrono::seconds(60), test::test_config()));
  INFO(result.summary());
  REQUIRE(result.all_ok());
}

// Under BRAID_ALGO=direct the flat form on registered buffers goes direct
// and the list form runs the ring; ranks that mix them fail, naming it.
TEST_CASE("the list form of reduce_scatter runs the ring under BRAID_ALGO=direct, and mixed forms fail there",
          "[collectives][list]") {
  on_two_ranks_direct([](Communicator& comm, const RegisteredPair& buffers) {
    const int r = comm.rank();
    const std::size_t count = 5000;
    float *recv = buffers.send, *input = buffers.out;  // count floats, and 2 x count
    std::fill_n(input, 2 * count, static_cast<float>(r + 1));
    comm.reduce_scatter(input, recv, count, DataType::f32, ReduceOp::sum).wait();
    expect(comm.last_algorithm(OpKind::reduce_scatter).name == "direct",
           "flat form: " + comm.last_algorithm(OpKind::reduce_scatter).name);
    std::vector<float> out(count);
    const std::vector<const void*> inputs{input, input + count};
    comm.reduce_scatter(inputs, out.data(), count, DataType::f32, ReduceOp::sum).wait();
    expect(comm.last_algorithm(OpKind::reduce_scatter).name == "ring",
           "list form: " + comm.last_algorithm(OpKind::reduce_scatter).name);
    expect(out[count - 1] == 3.0f && recv[0] == 3.0f, "results");
    expect_list_form_mismatch([&] {
      if (r == 0) comm.reduce_scatter(input, recv, count, DataType::f32, ReduceOp::sum).wait();
      else comm.reduce_scatter(inputs, recv, count, DataType::f32, ReduceOp::sum).wait();
    });
  });
}
