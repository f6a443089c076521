// A program outside braid's tree: it sees only the installed <braid/...>
// headers and links with `pkg-config --libs braid` (tests/install/run.sh).
// Each rank all-reduces and all-gathers small integers whose results are
// exact, and exits 0 only when every value is right.
#include <braid/braid.h>

#include <cstdio>
#include <vector>

namespace {

int check(const char* what, const std::vector<float>& got, const std::vector<float>& want, int rank) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      std::printf("client rank %d: %s wrong at %zu: %g, expected %g\n", rank, what, i, got[i], want[i]);
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main() {
  using braid::DataType;
  using braid::ReduceOp;
  try {
    auto comm = braid::comm::Communicator::create_world();
    const int rank = comm->rank();
    const int size = comm->size();
    const std::size_t count = 100'003;  // prime: not divisible by the ranks
    std::vector<float> data(count);
    for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<float>((i % 7) + rank);
    comm->all_reduce(data.data(), data.data(), count, DataType::f32, ReduceOp::sum).wait();
    std::vector<float> want(count);
    for (std::size_t i = 0; i < count; ++i) want[i] = static_cast<float>(size * (i % 7) + size * (size - 1) / 2);
    int failed = check("all_reduce", data, want, rank);

    float mine = static_cast<float>(10 * rank);
    std::vector<float> gathered(static_cast<std::size_t>(size));
    comm->all_gather(&mine, gathered.data(), 1, DataType::f32).wait();
    std::vector<float> ranks(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) ranks[r] = static_cast<float>(10 * r);
    failed |= check("all_gather", gathered, ranks, rank);
    if (!failed) std::printf("client rank %d/%d: all_reduce and all_gather correct (%s)\n", rank, size,
                             comm->transport_summary().c_str());
    return failed;
  } catch (const braid::Error& error) {
    std::printf("client: braid error: %s\n", error.what());
    return 2;
  }
}
