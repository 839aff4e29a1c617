#include "python/checked_calls.h"

#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <vector>

#include "python/calls.h"
#include "python/glue.h"

namespace py = pybind11;

namespace ringreduce {
namespace {

// Whether two optional strings (an algorithm or a transport name, or None) are the same.
bool same_name(py::handle a, py::handle b) {
  if (a.ptr() == b.ptr()) return true;  // literals are interned: the usual case
  return PyUnicode_Check(a.ptr()) && PyUnicode_Check(b.ptr()) && PyUnicode_Compare(a.ptr(), b.ptr()) == 0;
}

// all_reduce(tensor, op, group, async_op, algorithm, transport) calls that passed every check, each
// with the communicator and engine codes the checks found. Python's calls hold the GIL, which
// guards the entries.
class CheckedCalls {
 public:
  // The call's Work (None when it blocked), or NotImplemented when no checked call matches: then
  // the caller checks the arguments and remembers the call.
  py::object repeat(py::handle tensor, py::handle op, py::handle group, bool async_op, py::handle algorithm,
                    py::handle transport) {
    if (!THPVariable_CheckExact(tensor.ptr())) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    const at::Tensor& data = THPVariable_Unpack(tensor.ptr());
    const Entry* entry = find(data, op, group, algorithm, transport);
    if (entry == nullptr) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    // Held here: another thread may forget the entry while this call runs without the GIL.
    const std::shared_ptr<Communicator> communicator = entry->communicator;
    const c10::intrusive_ptr<c10d::Work> work =
        submit(*communicator, all_reduce_call(*communicator, data, entry->op_code, entry->algorithm_code, 0, 0), async_op);
    return work ? py::cast(work) : py::none();
  }

  void remember(py::handle tensor, py::handle op, py::handle group, py::handle algorithm, py::handle transport,
                std::shared_ptr<Communicator> communicator, int algorithm_code, int op_code) {
    const at::Tensor& data = THPVariable_Unpack(tensor.ptr());
    if (find(data, op, group, algorithm, transport) != nullptr) return;
    entries_.push_back(Entry{py::reinterpret_borrow<py::object>(op), py::reinterpret_borrow<py::object>(group),
                             py::reinterpret_borrow<py::object>(algorithm), py::reinterpret_borrow<py::object>(transport),
                             data.scalar_type(), data.get_device(), std::move(communicator),
                             static_cast<Algorithm>(algorithm_code), checked_op(op_code)});
  }

  // Forgets the calls on `group`, or every call when it is None.
  void forget(py::handle group) {
    // The forgotten entries are destroyed after entries_ is whole again: a communicator's
    // destructor releases the GIL, and another thread may then make a call.
    std::vector<Entry> forgotten;
    std::vector<Entry> kept;
    for (Entry& entry : entries_) {
      (group.is_none() || entry.group.ptr() == group.ptr() ? forgotten : kept).push_back(std::move(entry));
    }
    entries_ = std::move(kept);
  }

  std::size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    py::object op;  // a ReduceOp singleton: compared by identity
    py::object group;
    py::object algorithm;
    py::object transport;
    c10::ScalarType dtype;
    c10::DeviceIndex device;  // -1 on the CPU
    std::shared_ptr<Communicator> communicator;
    Algorithm algorithm_code;
    ReduceOp op_code;
  };

  const Entry* find(const at::Tensor& data, py::handle op, py::handle group, py::handle algorithm,
                    py::handle transport) const {
    for (const Entry& entry : entries_) {
      if (entry.op.ptr() == op.ptr() && entry.group.ptr() == group.ptr() && entry.dtype == data.scalar_type() &&
          entry.device == data.get_device() && same_name(entry.algorithm, algorithm) &&
          same_name(entry.transport, transport)) {
        return &entry;
      }
    }
    return nullptr;
  }

  // Few: one per (group, transport, algorithm, dtype, device, op) a program uses.
  std::vector<Entry> entries_;
};

}  // namespace

void bind_checked_calls(py::module_& module) {
  py::class_<CheckedCalls>(module, "CheckedCalls",
                           "all_reduce calls that passed every check, run again without them (ringreduce.all_reduce's "
                           "fast path)")
      .def(py::init<>())
      .def("repeat", &CheckedCalls::repeat, "the call's Work or None; NotImplemented when no checked call matches")
      .def("remember", &CheckedCalls::remember)
      .def("forget", &CheckedCalls::forget, "the calls on a group, or all (None)")
      .def("__len__", &CheckedCalls::size);
}

}  // namespace ringreduce
