/* ompi_bench: times MPI_Allreduce (f32 sum) or MPI_Bcast (root 0) for sizes
 * from -b to -e bytes (times -f), out of place, as braid-bench does: -w
 * untimed then -n timed calls back to back; each rank's time per call,
 * averaged over the ranks, in microseconds. scripts/ompi_compare.sh builds
 * it with mpicc and runs it beside braid-bench.
 *
 *   mpirun -n 2 ompi_bench allreduce 8 1048576 4 2000 200
 * prints "<bytes> <us>" per size. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double time_calls(int allreduce, float* send, float* recv, int count, int calls) {
  MPI_Barrier(MPI_COMM_WORLD);
  double start = MPI_Wtime();
  for (int i = 0; i < calls; ++i) {
    if (allreduce) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else MPI_Bcast(recv, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
  }
  return (MPI_Wtime() - start) / calls;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 7 || (strcmp(argv[1], "allreduce") && strcmp(argv[1], "bcast"))) {
    if (rank == 0) fprintf(stderr, "usage: ompi_bench allreduce|bcast MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP\n");
    MPI_Finalize();
    return 2;
  }
  const int allreduce = strcmp(argv[1], "allreduce") == 0;
  const long min_bytes = atol(argv[2]), max_bytes = atol(argv[3]);
  const int factor = atoi(argv[4]), iters = atoi(argv[5]), warmup = atoi(argv[6]);
  float* send = malloc(max_bytes + 64);
  float* recv = malloc(max_bytes + 64);
  for (long i = 0; i < max_bytes / 4 + 16; ++i) send[i] = recv[i] = (float)((i + rank) % 5);
  for (long bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
    const int count = (int)(bytes / 4 > 0 ? bytes / 4 : 1);
    time_calls(allreduce, send, recv, count, warmup);
    double mine = time_calls(allreduce, send, recv, count, iters), sum = 0;
    MPI_Reduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("%ld %.3f\n", bytes, sum / size * 1e6);
    if (factor < 2) break;
  }
  free(send);
  free(recv);
  MPI_Finalize();
  return 0;
}
