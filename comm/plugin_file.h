// Where braid's plugins are found: in the folder libbraid_comm.so itself
// was loaded from, whether that is the build tree or an install prefix.
// The CUDA part (device_loader.cc) and the RDMA transport
// (transport/ibverbs/loader.cc) are looked for there, and nowhere else.
#pragma once

#include <filesystem>
#include <string>

namespace braid::comm {

// The path of `file` beside libbraid_comm.so; empty, with `error` saying
// why, when the folder of libbraid_comm cannot be found.
std::filesystem::path beside_libbraid_comm(const char* file, std::string& error);

}  // namespace braid::comm
