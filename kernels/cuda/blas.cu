// cuBLAS is column-major. A row-major matrix X with row stride ld is, read
// column-major with the same ld, X^T. So row-major C = op(A) op(B) is
// column-major C^T = op(B)^T op(A)^T: call cuBLAS with the operands swapped,
// the same transpose flags, and M and N swapped. No data moves.
//
// cuBLAS is opened on first use (dlopen), not linked: where the toolkit is
// installed, a process that merely links libcublas spends 0.6-2 s and 200 MB
// starting it (libcublasLt's initialisers), and every braid-train and
// braid-bench process paid that, CPU runs and --help included. Tried in
// order: the soname (LD_LIBRARY_PATH, ld.so.cache), the folder libcudart was
// loaded from, and the toolkit's library folders found at build time.
#include <dlfcn.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/check.h"

#define BRAID_STRINGIFY_(x) #x
#define BRAID_STRINGIFY(x) BRAID_STRINGIFY_(x)
#ifndef BRAID_CUDA_LIBDIRS
#define BRAID_CUDA_LIBDIRS ""
#endif

namespace braid::kernels::cuda::detail {
namespace {

struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

void* open_cublas() {
  const std::string soname = "libcublas.so." BRAID_STRINGIFY(CUBLAS_VER_MAJOR);
  std::vector<std::string> tried{soname};
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string error = lib ? "" : dlerror();
  std::vector<std::string> folders;
  Dl_info cudart{};
  if (dladdr(reinterpret_cast<void*>(&cudaGetDevice), &cudart) && cudart.dli_fname) {
    std::string path = cudart.dli_fname;
    if (auto slash = path.rfind('/'); slash != std::string::npos) folders.push_back(path.substr(0, slash));
  }
  std::string dirs = BRAID_CUDA_LIBDIRS;
  for (std::size_t start = 0; start < dirs.size();) {
    std::size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    if (end > start) folders.push_back(dirs.substr(start, end - start));
    start = end + 1;
  }
  for (const std::string& folder : folders) {
    if (lib) break;
    tried.push_back(folder + "/" + soname);
    lib = dlopen(tried.back().c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!lib) {
    std::string list;
    for (const auto& name : tried) list += (list.empty() ? "" : ", ") + name;
    throw std::runtime_error("braid kernels: cannot open cuBLAS (tried " + list + "): " + error +
                             "; install the CUDA toolkit's cuBLAS " BRAID_STRINGIFY(CUBLAS_VER_MAJOR) +
                             std::string(" or put its folder on LD_LIBRARY_PATH"));
  }
  return lib;
}

template <typename Function>
void find(void* lib, const char* name, Function& into) {
  into = reinterpret_cast<Function>(dlsym(lib, name));
  if (!into) throw std::runtime_error(std::string("braid kernels: cuBLAS has no ") + name + ": " + dlerror());
}

const Cublas& cublas() {
  static const Cublas loaded = [] {
    void* lib = open_cublas();  // never closed: handles live as long as their threads
    Cublas c;
    find(lib, "cublasCreate_v2", c.create);
    find(lib, "cublasSetMathMode", c.set_math_mode);
    find(lib, "cublasSetStream_v2", c.set_stream);
    find(lib, "cublasSgemmStridedBatched", c.sgemm_strided_batched);
    find(lib, "cublasGetStatusName", c.status_name);
    find(lib, "cublasGetStatusString", c.status_string);
    return c;
  }();
  return loaded;
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("braid kernels: ") + what + " failed: " + cublas().status_name(status) +
                             ": " + cublas().status_string(status));
}

}  // namespace

cublasHandle_t cublas_handle(cudaStream_t stream) {
  thread_local std::map<int, cublasHandle_t> handles;  // device -> handle
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const Cublas& api = cublas();
  auto [it, inserted] = handles.try_emplace(device, nullptr);
  if (inserted) {
    check(api.create(&it->second), "cublasCreate");
    check(api.set_math_mode(it->second, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
  check(api.set_stream(it->second, stream), "cublasSetStream");
  return it->second;
}

void gemm_row_major(cudaStream_t stream, bool trans_a, bool trans_b, int M, int N, int K,
                    float alpha, const float* A, int lda, long long stride_a,
                    const float* B, int ldb, long long stride_b, float beta,
                    float* C, int ldc, long long stride_c, int batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublas().sgemm_strided_batched(cublas_handle(stream), op_b, op_a, N, M, K, &alpha,
                                  B, ldb, stride_b, A, lda, stride_a, &beta,
                                  C, ldc, stride_c, batch),
        "cublasSgemmStridedBatched");
}

}  // namespace braid::kernels::cuda::detail

namespace braid::kernels::cuda {

void load_blas() { detail::cublas_handle(nullptr); }

std::string blas_library() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(detail::cublas().create), &info) || !info.dli_fname)
    throw std::runtime_error("braid kernels: cuBLAS is open but dladdr cannot name its file");
  return info.dli_fname;
}

}  // namespace braid::kernels::cuda
