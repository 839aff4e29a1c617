#include "python/ps_bindings.h"

#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>
#include <vector>

#include "ps/parameter_server.h"
#include "python/glue.h"
#include "transports/pg.h"
#include "transports/shm.h"

namespace py = pybind11;

namespace ringreduce {
namespace {

// The flat fp32 buffer behind a tensor ringreduce/ps.py has checked already; checked again here,
// since a wrong pointer would be a crash rather than an error.
float* flat_floats(const at::Tensor& tensor, std::size_t numel, const char* what) {
  RR_CHECK(tensor.device().is_cpu() && tensor.scalar_type() == at::kFloat && tensor.is_contiguous() &&
               static_cast<std::size_t>(tensor.numel()) == numel,
           what, " must be a contiguous float32 CPU tensor of ", numel, " elements");
  return tensor.data_ptr<float>();
}

// A Python callable kept by C++ threads: dropped, like called, with the GIL.
std::shared_ptr<py::object> keep_callable(py::object callable) {
  return std::shared_ptr<py::object>(new py::object(std::move(callable)), [](py::object* kept) {
    py::gil_scoped_acquire gil;
    delete kept;
  });
}

// The server rank: the parameters, its own worker, and a link per remote worker.
// How long stop() waits for its cancelled links to tell their workers: each writes its notice in
// the store and closes its transport, a few milliseconds here; the bound is for a loaded machine or
// a slow store, and is spent only if one is.
constexpr std::chrono::milliseconds kStoppedLinksWait{2000};

class Server {
 public:
  // `update` None: SGD with `lr` (each push moves the parameters by lr / workers times its
  // gradient, so a round of pushes from every worker is one synchronous step). Otherwise
  // update(grad) is called with each gradient (a tensor valid during the call) to apply it to
  // `params` itself, one call at a time.
  Server(at::Tensor params, int workers, int rank, std::int64_t staleness, double lr, py::object update,
         bool keep_gradients)
      : params_(std::move(params)), server_rank_(rank) {
    const std::size_t numel = static_cast<std::size_t>(params_.numel());
    ps::Update apply;
    if (update.is_none()) {
      const float step = static_cast<float>(lr / workers);
      apply = [step](float* p, const float* g, std::size_t n) { ps::sgd_update(p, g, n, step); };
    } else {
      apply = [callable = keep_callable(std::move(update))](float*, const float* g, std::size_t n) {
        py::gil_scoped_acquire gil;
        try {
          (*callable)(at::from_blob(const_cast<float*>(g), {static_cast<std::int64_t>(n)}, at::kFloat));
        } catch (py::error_already_set& error) {
          throw std::runtime_error(std::string("the server's update raised ") + error.what());
        }
      };
    }
    state_ = std::make_unique<ps::ServerState>(flat_floats(params_, numel, "the server's parameters"), numel, workers,
                                               staleness, std::move(apply), keep_gradients);
    local_ = std::make_unique<ps::LocalWorker>(*state_, rank);
    Live<Server>::all().add(this);
  }

  ~Server() {
    Live<Server>::all().remove(this);
    // Dropped without close(): the workers still pushing are told, and no link waits on one.
    stop("ringreduce.ps: the parameter server has stopped: it was dropped without close()");
    links_.clear();
  }

  void add_link(int worker, std::shared_ptr<Transport> transport, double timeout_s) {
    auto link = std::make_unique<ps::ServerLink>(*state_, worker, server_rank_, std::move(transport),
                                                 to_millis(timeout_s));
    const std::lock_guard<std::mutex> lock(links_mutex_);
    links_.push_back(std::move(link));
  }

  // Stops now: every waiting call raises `why`, and each link wakes from its transport and tells
  // its worker, which this waits for (a process that exits next would otherwise close the
  // connections first, and the workers would learn nothing but that). Any thread (the exit's too).
  void stop(const std::string& why) {
    state_->stop(why);
    const std::lock_guard<std::mutex> lock(links_mutex_);
    for (auto& link : links_) link->cancel();
    const auto deadline = std::chrono::steady_clock::now() + kStoppedLinksWait;
    for (auto& link : links_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      link->finished_within(std::max(left, std::chrono::milliseconds(0)));
    }
  }

  std::uint64_t join(const at::Tensor& params) {
    return local_->join(flat_floats(params, state_->numel(), "params"));
  }
  std::uint64_t push(const at::Tensor& grad, const at::Tensor& params) {
    return local_->push(flat_floats(grad, state_->numel(), "grad"), flat_floats(params, state_->numel(), "params"));
  }
  void leave() { local_->leave(); }
  // Waits up to `timeout_s` for every remote worker to leave or be lost; true once all have. Raises
  // the server's failure, if any. Short waits in a loop let the caller take Ctrl-C between them.
  bool wait(double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + to_millis(timeout_s);
    for (auto& link : links_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (!link->finished_within(std::max(left, std::chrono::milliseconds(0)))) return false;
    }
    const std::string failure = state_->failure();
    if (!failure.empty()) throw std::runtime_error(failure);
    return true;
  }

  std::uint64_t version() const { return state_->version(); }
  std::uint64_t bytes_sent() const { return over_links(&ps::ServerLink::bytes_sent); }
  std::uint64_t bytes_received() const { return over_links(&ps::ServerLink::bytes_received); }
  std::vector<std::tuple<int, std::uint64_t, std::uint64_t, std::uint64_t>> log() const {
    std::vector<std::tuple<int, std::uint64_t, std::uint64_t, std::uint64_t>> rows;
    for (const ps::PushRecord& r : state_->log()) rows.emplace_back(r.worker, r.step, r.version_read, r.version_applied);
    return rows;
  }
  py::list reports() const {
    std::vector<ps::WorkerReport> reports;
    {
      py::gil_scoped_release release;
      reports = state_->reports();
    }
    py::list out;
    for (const ps::WorkerReport& r : reports) {
      py::dict row;
      row["pushes"] = r.pushes;
      row["staleness_sum"] = r.staleness_sum;
      row["staleness_max"] = r.staleness_max;
      row["lost"] = r.lost.empty() ? py::object(py::none()) : py::object(py::str(r.lost));
      out.append(row);
    }
    return out;
  }
  std::vector<at::Tensor> gradients() const {
    std::vector<std::vector<float>> kept;
    {
      py::gil_scoped_release release;
      kept = state_->gradients();
    }
    std::vector<at::Tensor> out;
    for (const auto& g : kept) {
      out.push_back(at::tensor(at::ArrayRef<float>(g.data(), g.size()), at::kFloat));
    }
    return out;
  }

 private:
  std::uint64_t over_links(std::uint64_t (ps::ServerLink::*count)() const) const {
    std::uint64_t sum = 0;
    for (const auto& link : links_) sum += (*link.*count)();
    return sum;
  }

  at::Tensor params_;
  std::unique_ptr<ps::ServerState> state_;
  std::unique_ptr<ps::LocalWorker> local_;
  const int server_rank_;
  std::mutex links_mutex_;  // add_link() against stop() from another thread; the rest is the owner's
  std::vector<std::unique_ptr<ps::ServerLink>> links_;
};

// A worker on a rank other than the server's.
class RemoteWorker {
 public:
  RemoteWorker(std::shared_ptr<Transport> transport, std::size_t numel, int server_rank)
      : worker_(std::move(transport), numel, server_rank), numel_(numel) {}
  std::uint64_t join(const at::Tensor& params) { return worker_.join(flat_floats(params, numel_, "params")); }
  std::uint64_t push(const at::Tensor& grad, const at::Tensor& params) {
    return worker_.push(flat_floats(grad, numel_, "grad"), flat_floats(params, numel_, "params"));
  }
  void leave() { worker_.leave(); }
  std::uint64_t bytes_sent() const { return worker_.bytes_sent(); }
  std::uint64_t bytes_received() const { return worker_.bytes_received(); }

 private:
  ps::RemoteWorker worker_;
  std::size_t numel_;
};

// At interpreter exit: every live server stops (its links wake and tell their workers `why`), so
// no link thread is left waiting on a peer when the process ends.
void stop_parameter_servers(const std::string& why) {
  auto& live = Live<Server>::all();
  const std::lock_guard<std::mutex> lock(live.mutex);
  for (Server* server : live.objects) server->stop(why);
}

}  // namespace

void bind_parameter_server(py::module_& m) {
  using release = py::call_guard<py::gil_scoped_release>;
  py::class_<Transport, std::shared_ptr<Transport>>(m, "Transport", "A transport between the ranks of one group.")
      .def_property_readonly("rank", &Transport::rank)
      .def_property_readonly("size", &Transport::size)
      .def_property_readonly("name", &Transport::name)
      .def("name_ranks", &Transport::name_ranks, py::arg("names"), "The group ranks its ranks stand for, in messages.");

  m.def(
      "shm_transport",
      [](c10d::Store& store, int rank, int world, double timeout_s) -> std::shared_ptr<Transport> {
        StoreRendezvous rendezvous(store);
        return std::make_shared<ShmTransport>(rendezvous, rank, world, to_millis(timeout_s));
      },
      py::arg("store"), py::arg("rank"), py::arg("world"), py::arg("timeout_s"), release(),
      "A shared-memory transport (collective over the `world` ranks that share `store`).");
  m.def(
      "pg_transport",
      [](c10d::Backend& backend, c10d::Store& store, double timeout_s) -> std::shared_ptr<Transport> {
        return std::make_shared<ProcessGroupTransport>(c10::intrusive_ptr<c10d::Backend>::reclaim_copy(&backend),
                                                       std::make_unique<StoreRendezvous>(store), to_millis(timeout_s));
      },
      py::arg("backend"), py::arg("store"), py::arg("timeout_s"),
      "A transport over a torch.distributed backend; `store` carries abort notices.");

  py::class_<Server, std::shared_ptr<Server>>(m, "PsServer")
      .def(py::init([](at::Tensor params, int workers, int rank, std::int64_t staleness, double lr, py::object update,
                       bool keep_gradients) {
             return std::shared_ptr<Server>(
                 new Server(std::move(params), workers, rank, staleness, lr, std::move(update), keep_gradients),
                 &delete_without_gil<Server>);
           }),
           py::arg("params"), py::arg("workers"), py::arg("rank"), py::arg("staleness"), py::arg("lr"),
           py::arg("update"), py::arg("keep_gradients"))
      .def("add_link", &Server::add_link, py::arg("worker"), py::arg("transport"), py::arg("timeout_s"))
      .def("stop", &Server::stop, py::arg("why"), release())
      .def("join", &Server::join, py::arg("params"), release())
      .def("push", &Server::push, py::arg("grad"), py::arg("params"), release())
      .def("leave", &Server::leave, release())
      .def("wait", &Server::wait, py::arg("timeout_s"), release())
      .def_property_readonly("version", py::cpp_function(&Server::version, release()))
      .def_property_readonly("bytes_sent", &Server::bytes_sent)
      .def_property_readonly("bytes_received", &Server::bytes_received)
      .def("log", &Server::log, release())
      .def("reports", &Server::reports)
      .def("gradients", &Server::gradients);

  m.def("stop_parameter_servers", &stop_parameter_servers, py::arg("why"), py::call_guard<py::gil_scoped_release>(),
        "At interpreter exit: every live parameter server stops, telling its workers `why`.");

  // Dropped without the GIL, as the server: its destructor tells the server it leaves, over the network.
  py::class_<RemoteWorker, std::shared_ptr<RemoteWorker>>(m, "PsWorker")
      .def(py::init([](std::shared_ptr<Transport> transport, std::size_t numel, int server_rank) {
             return std::shared_ptr<RemoteWorker>(new RemoteWorker(std::move(transport), numel, server_rank),
                                                  &delete_without_gil<RemoteWorker>);
           }),
           py::arg("transport"), py::arg("numel"), py::arg("server_rank"))
      .def("join", &RemoteWorker::join, py::arg("params"), release())
      .def("push", &RemoteWorker::push, py::arg("grad"), py::arg("params"), release())
      .def("leave", &RemoteWorker::leave, release())
      .def_property_readonly("bytes_sent", &RemoteWorker::bytes_sent)
      .def_property_readonly("bytes_received", &RemoteWorker::bytes_received);
}

}  // namespace ringreduce
