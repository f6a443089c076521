// braid_torch._C: the Python face of ProcessGroupBraid. __init__.py registers
// create_process_group with torch.distributed as backend "braid".
//
// The process group crosses into Python as torch's own ProcessGroup type
// (torch.distributed must be imported first, which __init__.py does), so
// everything torch does with a process group works on it.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "braid/errors.h"
#include "process_group.h"

namespace py = pybind11;

namespace {

// `group` as braid's own, for the functions that ask it about itself.
braid::torch_backend::ProcessGroupBraid& braid_group(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                                     const char* function) {
  auto* braid_group = dynamic_cast<braid::torch_backend::ProcessGroupBraid*>(group.get());
  if (!braid_group) throw braid::InvalidUsage(std::string("braid: ") + function + ": not a braid process group");
  return *braid_group;
}

}  // namespace

PYBIND11_MODULE(_C, module) {
  module.doc() = "braid as a torch.distributed backend";
  module.def("create_process_group", &braid::torch_backend::create_process_group, py::arg("store"),
             py::arg("rank"), py::arg("size"), py::arg("timeout"),
             py::call_guard<py::gil_scoped_release>(),
             "A braid process group of `size` ranks that meet through torch's `store` (blocks until they have).");
  module.def(
      "transport_summary",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
        return braid_group(group, "transport_summary").transport_summary();
      },
      py::arg("group"), "The transports braid chose for the group's peers: \"shm\", \"tcp\", \"shm+tcp\".");
  module.def(
      "staging_blocks",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
        return braid_group(group, "staging_blocks").staging_blocks_mapped();
      },
      py::arg("group"),
      "Host staging blocks (list forms, coalesced calls) the group has mapped so far; kept ones are reused.");
  module.def(
      "abort",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::string& reason) {
        braid_group(group, "abort").abort(reason);
      },
      py::arg("group"), py::arg("reason"), py::call_guard<py::gil_scoped_release>(),
      "Fails the group now, from any thread: its running call fails at its next wait, queued and later calls at "
      "once, the peers at their next wait on this rank, each naming `reason`.");
  module.def("quiesce", &braid::torch_backend::quiesce, py::arg("limit"), py::call_guard<py::gil_scoped_release>(),
             "Waits (up to `limit`) until no group has a call in flight or a future callback running.");
}
