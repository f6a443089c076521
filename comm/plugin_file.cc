#include "comm/plugin_file.h"

#include <dlfcn.h>

namespace braid::comm {
namespace {

void anchor() {}  // an address inside libbraid_comm.so, to find its folder

}  // namespace

std::filesystem::path beside_libbraid_comm(const char* file, std::string& error) {
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&anchor), &self) == 0 || self.dli_fname == nullptr) {
    error = "cannot find the folder of libbraid_comm";
    return {};
  }
  return std::filesystem::path(self.dli_fname).parent_path() / file;
}

}  // namespace braid::comm
