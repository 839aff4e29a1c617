// Python bindings: the communicators' methods and the group factories; the test-only probes are
// bound under _C._testing by csrc/testing/.
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cpu/reducer.h"
#include "engine/auto_choice.h"
#include "engine/communicator.h"
#include "engine/cost_model.h"
#include "python/backend.h"
#include "python/calls.h"
#include "python/checked_calls.h"
#include "python/glue.h"
#include "python/ps_bindings.h"
#include "transports/local.h"
#include "transports/pg.h"
#include "transports/shm.h"

#if defined(RINGREDUCE_WITH_SIM)
#include "cuda/device_memory.h"
#include "cuda/nccl_transport.h"
#include "cuda/sim_device.h"
#endif
#if defined(RINGREDUCE_WITH_CUDA)
#include "cuda/real_api.h"
#endif

namespace py = pybind11;

namespace ringreduce {
namespace {

// A Work to Python, or None for a blocking call that already ran.
py::object to_python(const c10::intrusive_ptr<c10d::Work>& work) { return work ? py::cast(work) : py::none(); }

// An auto table as Python passes it: (transport, world, up_to_bytes, algorithm code) lines.
using TableLines = std::vector<std::tuple<std::string, int, std::uint64_t, int>>;

std::vector<AutoRule> rules_of(const TableLines& lines) {
  std::vector<AutoRule> rules;
  for (const auto& [transport, world, up_to_bytes, algorithm] : lines) {
    if (algorithm < 0 || algorithm >= static_cast<int>(Algorithm::Auto) || world < 1) {
      throw py::value_error(detail::concat("bad auto table line for ", transport, ": world ", world,
                                           ", algorithm code ", algorithm));
    }
    rules.push_back({transport, world, up_to_bytes, static_cast<Algorithm>(algorithm)});
  }
  return rules;
}

Algorithm checked_algorithm(int algorithm_code) {
  if (algorithm_code < 0 || algorithm_code > static_cast<int>(Algorithm::Auto)) {
    throw std::invalid_argument(detail::concat("ringreduce: bad algorithm code ", algorithm_code));
  }
  return static_cast<Algorithm>(algorithm_code);
}

Compression checked_compression(int compression_code) {
  if (compression_code < 0 || compression_code > static_cast<int>(Compression::Int8)) {
    throw std::invalid_argument(detail::concat("ringreduce: bad compression code ", compression_code));
  }
  return static_cast<Compression>(compression_code);
}

py::object all_reduce(Communicator& communicator, const at::Tensor& tensor, int op_code, int algorithm_code,
                      std::size_t segment_bytes, int root, bool async_op, int compression_code,
                      const std::optional<at::Tensor>& residual) {
  return to_python(submit(communicator,
                          all_reduce_call(communicator, tensor, checked_op(op_code), checked_algorithm(algorithm_code),
                                          segment_bytes, root, checked_compression(compression_code), residual),
                          async_op));
}

py::object reduce_scatter(Communicator& communicator, const at::Tensor& output, const at::Tensor& input, int op_code,
                          int algorithm_code, std::size_t segment_bytes, bool async_op, int compression_code) {
  return to_python(submit(communicator,
                          reduce_scatter_call(communicator, output, input, checked_op(op_code),
                                              checked_algorithm(algorithm_code), segment_bytes,
                                              checked_compression(compression_code)),
                          async_op));
}

py::object all_gather(Communicator& communicator, const at::Tensor& output, const at::Tensor& input,
                      int algorithm_code, std::size_t segment_bytes, bool async_op) {
  return to_python(submit(communicator,
                          all_gather_call(communicator, output, input, checked_algorithm(algorithm_code), segment_bytes),
                          async_op));
}

py::object reduce(Communicator& communicator, const at::Tensor& tensor, int op_code, int root,
                  std::size_t segment_bytes, bool async_op) {
  return to_python(submit(communicator, reduce_call(communicator, tensor, checked_op(op_code), root, segment_bytes),
                          async_op));
}

py::object broadcast(Communicator& communicator, const at::Tensor& tensor, int root, std::size_t segment_bytes,
                     bool async_op) {
  return to_python(submit(communicator, broadcast_call(communicator, tensor, root, segment_bytes), async_op));
}

std::vector<std::shared_ptr<Communicator>> local_world(int world, double timeout_s, const std::string& kind, int device) {
  const std::chrono::milliseconds timeout = to_millis(timeout_s);
  std::vector<std::shared_ptr<Communicator>> ranks(world);
#if defined(RINGREDUCE_WITH_SIM)
  if (kind == "sim_nccl") {
    // Creating an nccl communicator is collective: every rank at once, on threads of their own.
    const MemoryRendezvous keys(timeout);
    std::vector<std::exception_ptr> failed(world);
    std::vector<std::thread> creators;
    for (int rank = 0; rank < world; ++rank) {
      creators.emplace_back([&, rank] {
        try {
          ranks[rank] = make_sim_nccl_communicator(std::make_unique<MemoryRendezvous>(keys), rank, world, rank, timeout);
        } catch (...) {
          failed[rank] = std::current_exception();
        }
      });
    }
    for (std::thread& creator : creators) creator.join();
    for (const std::exception_ptr& error : failed) {
      if (error) std::rethrow_exception(error);
    }
    return ranks;
  }
#endif
  auto hub = std::make_shared<LocalHub>(world, timeout);
  for (int rank = 0; rank < world; ++rank) {
    if (kind == "cpu") {
      ranks[rank] = make_communicator(std::make_unique<LocalTransport>(hub, rank, std::make_unique<HostMemory>()));
      continue;
    }
#if defined(RINGREDUCE_WITH_SIM)
    const auto on_device = [&](cuda::DeviceQueue& queue) {
      return std::make_unique<LocalTransport>(hub, rank, std::make_unique<cuda::DeviceMemory>(queue));
    };
    if (kind == "sim") {
      ranks[rank] = make_device_communicator(cuda::sim_device(), rank, on_device, timeout);
      continue;
    }
#if defined(RINGREDUCE_WITH_CUDA)
    if (kind == "cuda") {
      ranks[rank] = make_device_communicator(cuda::real_device(), device, on_device);
      continue;
    }
#endif
#endif
    throw py::value_error(detail::concat("ringreduce: this build has no LocalWorld ranks of kind '", kind,
                                         "'; build_info() says what it has"));
  }
  return ranks;
}

py::dict build_info() {
  py::dict info;
  info["version"] = RINGREDUCE_VERSION;
  info["torch"] = RINGREDUCE_TORCH_VERSION;
#if defined(RINGREDUCE_WITH_CUDA)
  info["cuda"] = true;
  info["nccl"] = cuda::real_nccl().version();
  info["transports"] = py::make_tuple("local", "pg", "shm", "sim", "nccl");
#else
  info["cuda"] = false;
  info["nccl"] = py::none();
#if defined(RINGREDUCE_WITH_SIM)
  info["transports"] = py::make_tuple("local", "pg", "shm", "sim");
#else
  info["transports"] = py::make_tuple("local", "pg", "shm");
#endif
#endif
#if defined(RINGREDUCE_WITH_SIM)
  info["sim"] = true;
#else
  info["sim"] = false;
#endif
  return info;
}

}  // namespace

// The test-only door (csrc/testing/testing.h): that room sits above this one, so it is declared here, not included.
void bind_testing(py::module_& parent);

}  // namespace ringreduce

PYBIND11_MODULE(_C, m) {
  using namespace ringreduce;
  py::module_::import("torch.distributed");  // c10d::Backend's Python type, the base of ours
  m.doc() = "ringreduce engine: ring and central all-reduce over pluggable transports";
  py::register_exception<TimeoutError>(m, "CommTimeoutError", PyExc_RuntimeError);
  py::register_exception<MismatchError>(m, "MismatchError", PyExc_RuntimeError);
  py::register_exception_translator(&translate_ranks_lost);

  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("transport", &Communicator::transport_name)
      .def_property_readonly(
          "hosts",
          [](const Communicator& communicator) -> py::object {
            const HostLayout* layout = communicator.host_layout();
            return layout == nullptr ? py::none() : py::cast(layout->describe());
          },
          "Which ranks share a host (\"2 hosts x 2 ranks\"), where the group spans hosts; else None.")
      .def("advise_on_failure", &Communicator::advise_on_failure, py::arg("advice"),
           "Without a membership: `advice` is added to every failure that is not a disagreement. Call before the "
           "first collective.")
      .def_property_readonly("has_hierarchy", &Communicator::has_hierarchy,
                             "Whether algorithm 'hierarchical' runs here (several hosts, several ranks on some).")
      .def_property_readonly("has_chunked_hierarchy", &Communicator::has_chunked_hierarchy,
                             "Whether reduce-scatter and all-gather run hierarchical here (where they move fewer "
                             "bytes across hosts than the ring: 2x2, 3+2, 4+4+3, not 2+1+2).")
      .def(
          "auto_choices",
          [](Communicator& communicator) {
            std::vector<std::pair<std::uint64_t, Algorithm>> choices;
            {
              const py::gil_scoped_release release;  // waits behind the collectives in flight
              communicator.executor().run([&] { choices = communicator.auto_choices(); });
            }
            py::dict named;
            for (const auto& [floor, algorithm] : choices) named[py::int_(floor)] = algorithm_name(algorithm);
            return named;
          },
          "what algorithm='auto' runs now in each size class it has learned: {smallest size in bytes: algorithm}")
      .def_property_readonly(
          "auto_table",
          [](const Communicator& communicator) {
            const AutoTable& table = communicator.auto_table();
            py::list lines;
            for (const AutoRule& r : table.rules) {
              lines.append(py::make_tuple(r.transport, r.world, r.up_to_bytes, static_cast<int>(r.algorithm)));
            }
            py::dict out;
            out["source"] = table.source;
            out["lines"] = lines;
            return out;
          },
          "The auto table this communicator follows: {'source': where it came from, 'lines': [(transport, world, "
          "up_to_bytes, algorithm code)]}.")
      .def(
          "adopt_auto_table",
          [](Communicator& communicator, const TableLines& lines, std::string source) {
            std::shared_ptr<const AutoTable> table = make_auto_table(rules_of(lines), std::move(source));
            const py::gil_scoped_release release;
            communicator.executor().run([&] { communicator.adopt_auto_table(table); });
          },
          py::arg("lines"), py::arg("source"),
          "Follow this table from now on (the group's agreed one; before its first collective).")
      .def(
          "working_bytes",
          [](Communicator& communicator) {
            return communicator.host_working_bytes() + caller_working_bytes(communicator);
          },
          "host memory this communicator keeps between calls as working memory, in bytes")
      .def("auto_learns", &Communicator::auto_learns, py::arg("bytes"),
           "whether algorithm='auto' learns the algorithm of an all-reduce of `bytes` here (else a table or the prior "
           "decides)")
      .def("all_reduce", &all_reduce, py::arg("tensor"), py::arg("op"), py::arg("algorithm"), py::arg("segment_bytes"),
           py::arg("root"), py::arg("async_op"), py::arg("compression") = 0, py::arg("residual") = py::none())
      .def("reduce_scatter", &reduce_scatter, py::arg("output"), py::arg("input"), py::arg("op"),
           py::arg("algorithm"), py::arg("segment_bytes"), py::arg("async_op"), py::arg("compression") = 0)
      .def("all_gather", &all_gather, py::arg("output"), py::arg("input"), py::arg("algorithm"),
           py::arg("segment_bytes"), py::arg("async_op"))
      .def("broadcast", &broadcast, py::arg("tensor"), py::arg("root"), py::arg("segment_bytes"), py::arg("async_op"))
      .def("reduce", &reduce, py::arg("tensor"), py::arg("op"), py::arg("root"), py::arg("segment_bytes"),
           py::arg("async_op"));

  m.def("local_world", &local_world, py::arg("world"), py::arg("timeout_s"), py::arg("kind") = "cpu",
        py::arg("device") = -1, py::call_guard<py::gil_scoped_release>(),
        "Communicators for `world` ranks that are threads of this process. kind 'cpu': host memory; 'cuda': "
        "virtual ranks on GPU `device`; 'sim': rank r on simulated GPU r, over the local transport; 'sim_nccl': the "
        "same over the simulated NCCL.");

  m.def(
      "pg_communicator",
      [](c10d::Backend& backend, c10d::Store& store, double timeout_s, const std::vector<int>& hosts) {
        auto owned = c10::intrusive_ptr<c10d::Backend>::reclaim_copy(&backend);
        const int rank = owned->getRank();
        std::unique_ptr<HostTier> tier;
        if (!hosts.empty()) {
          HostLayout layout(hosts);
          if (layout.world() != owned->getSize()) {
            throw std::invalid_argument(ringreduce::detail::concat("ringreduce: a host layout of ", layout.world(),
                                                       " ranks for a group of ", owned->getSize()));
          }
          if (layout.hosts() > 1) tier = std::make_unique<HostTier>(HostTier{std::move(layout), nullptr});
        }
        if (tier) {
          // This host's ranks meet in shared memory, under keys of their own host.
          const int host = tier->layout.host_of(rank);
          const std::vector<int>& here = tier->layout.ranks_of(host);
          if (here.size() > 1) {
            StoreRendezvous keys(store);
            PrefixRendezvous host_keys(keys, ringreduce::detail::concat("host", host, "/"));
            tier->neighbours = std::make_unique<ShmTransport>(host_keys, tier->layout.local_of(rank),
                                                              static_cast<int>(here.size()), to_millis(timeout_s));
          }
        }
        return make_communicator(std::make_unique<ProcessGroupTransport>(
                                     std::move(owned),
                                     std::make_unique<BoundedRendezvous>(std::make_shared<StoreRendezvous>(store),
                                                                         kStoreReplyLimit),
                                     to_millis(timeout_s)),
                                 &make_cpu_reducer, nullptr, std::move(tier));
      },
      py::arg("backend"), py::arg("store"), py::arg("timeout_s"), py::arg("hosts") = std::vector<int>{},
      py::call_guard<py::gil_scoped_release>(),
      "A communicator over a torch.distributed backend (e.g. gloo); `store` carries abort notices. `hosts` (each "
      "rank's host, as labels) adds shared memory among this host's ranks and the hierarchical all-reduce, where "
      "the group spans hosts (collective: each host's ranks meet through `store`).");

  m.def(
      "gather_values",
      [](c10d::Store& store, int rank, int size, const std::string& value) {
        StoreRendezvous keys(store);
        return all_gather_values(keys, "gathered", rank, size, value);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("value"), py::call_guard<py::gil_scoped_release>(),
      "Every rank's `value` (text), in rank order, through `store` in three requests per rank (collective; "
      "core/rendezvous.h's all_gather_values).");

  m.def(
      "shm_communicator",
      [](c10d::Store& store, int rank, int world, double timeout_s) {
        StoreRendezvous rendezvous(store);
        return make_communicator(std::make_unique<ShmTransport>(rendezvous, rank, world, to_millis(timeout_s)));
      },
      py::arg("store"), py::arg("rank"), py::arg("world"), py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
      "A communicator over shared memory; every rank of the group must be on this host.");

#if defined(RINGREDUCE_WITH_SIM)
  m.def(
      "sim_communicator",
      [](c10d::Store& store, int rank, int world, double timeout_s) {
        return make_sim_nccl_communicator(std::make_unique<StoreRendezvous>(store), rank, world, 0, to_millis(timeout_s));
      },
      py::arg("store"), py::arg("rank"), py::arg("world"), py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
      "A communicator over the simulated NCCL on this process's simulated GPU 0, serving CPU tensors.");
#endif

#if defined(RINGREDUCE_WITH_CUDA)
  m.def(
      "nccl_communicator",
      [](c10d::Store& store, int rank, int world, int device, double timeout_s) {
        return make_nccl_communicator(store, rank, world, device, to_millis(timeout_s));
      },
      py::arg("store"), py::arg("rank"), py::arg("world"), py::arg("device"), py::arg("timeout_s"),
      py::call_guard<py::gil_scoped_release>(), "A communicator over NCCL point-to-point on GPU `device`.");
#endif

  m.def("build_info", &build_info);
  m.def(
      "wait_until_idle",
      [](double timeout_s) {
        const std::chrono::milliseconds budget = to_millis(timeout_s);
#if defined(RINGREDUCE_WITH_SIM)
        const auto start = std::chrono::steady_clock::now();
        const bool idle = OrderedExecutor::wait_until_all_idle(budget);
        const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
        return cuda::NcclTransport::wait_for_endings(std::max(budget - spent, std::chrono::milliseconds(0))) && idle;
#else
        return OrderedExecutor::wait_until_all_idle(budget);
#endif
      },
      py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
      "Waits until no communicator's worker runs or holds a job and no NCCL communicator is still ending (at most "
      "`timeout_s` in all); whether they all went idle.");
  m.def("stop_pulses", &stop_every_pulse, py::call_guard<py::gil_scoped_release>(),
        "At interpreter exit: stops every group's pulse thread (engine/membership.h).");
  m.def("drop_backend_delegates", &RingReduceBackend::drop_delegates_at_exit, py::call_guard<py::gil_scoped_release>(),
        "At interpreter exit: every ringreduce backend drops its gloo and NCCL delegates (joining their threads).");
  m.def(
      "set_auto_table",
      [](const TableLines& lines, std::string source) { set_auto_table(rules_of(lines), std::move(source)); },
      py::arg("lines"), py::arg("source"),
      "Replaces the auto table: (transport, world, up_to_bytes, algorithm code) lines.");
  m.def(
      "set_auto_logging", [](bool on) { set_auto_logger(on ? &debug_info : nullptr); }, py::arg("on"),
      "Says what auto chooses, and why, through ringreduce._debug (RINGREDUCE_DEBUG=INFO).");
  m.def(
      "all_reduce_cost_terms",
      [](int algorithm, std::uint64_t bytes, const std::vector<int>& host_of_rank) {
        const CostTerms t = all_reduce_cost_terms(checked_algorithm(algorithm), bytes, host_of_rank);
        return py::dict(py::arg("link_messages") = t.link_messages, py::arg("link_bytes") = t.link_bytes,
                        py::arg("local_messages") = t.local_messages, py::arg("local_bytes") = t.local_bytes,
                        py::arg("reduced_bytes") = t.reduced_bytes);
      },
      py::arg("algorithm"), py::arg("bytes"), py::arg("host_of_rank"),
      "The cost model's terms of an all-reduce (engine/cost_model.h) by algorithm code, rank r on host "
      "host_of_rank[r].");
  m.def(
      "chunked_hierarchy_pays",
      [](const std::vector<int>& host_of_rank) { return HostLayout(host_of_rank).chunked_hierarchy_pays(); },
      py::arg("host_of_rank"),
      "Whether the hierarchical reduce-scatter and all-gather run with rank r on host host_of_rank[r]: where "
      "they move fewer bytes across hosts than the ring (hierarchy/host_layout.h).");
  m.def(
      "choose_algorithm",
      [](const std::string& transport, int world, std::uint64_t bytes, bool host_memory, bool spans_hosts) {
        return static_cast<int>(
            choose_algorithm(*current_auto_table(), transport, world, bytes, host_memory, false, spans_hosts));
      },
      py::arg("transport"), py::arg("world"), py::arg("bytes"), py::arg("host_memory") = true,
      py::arg("spans_hosts") = false,
      "The algorithm code of the table, or of the prior where the table has no lines (what auto runs before it learns).");

  py::class_<Membership, std::shared_ptr<Membership>>(
      m, "Membership", "Who in a group is still there: pulses through the group's store (engine/membership.h).")
      .def(py::init([](c10d::Store& pulse_store, c10d::Store& store, int rank, int size, const std::string& host,
                       const std::string& probe_address, double timeout_s) {
             // Without the GIL while the others are waited for, and with it again before pybind11
             // registers the new object (a call_guard would register it without: threads that made
             // memberships at once corrupted pybind11's registry, and one's deallocation aborted).
             const py::gil_scoped_release without_gil;
             return std::make_shared<Membership>(
                 std::make_unique<StoreRendezvous>(pulse_store),
                 std::make_unique<BoundedRendezvous>(std::make_shared<StoreRendezvous>(store), kStoreReplyLimit), rank,
                 size, host, probe_address, lost_after_from_env(), to_millis(timeout_s));
           }),
           py::arg("pulse_store"), py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("host"),
           py::arg("probe_address"), py::arg("timeout_s"),
           "Collective over the group. `pulse_store`: a second connection to `store` (store.clone()) for the pulse "
           "thread; `host`: the process's host identity; `probe_address`: the address other hosts reach this one "
           "by, on which they probe its liveness port (\"\": none). RINGREDUCE_LOST_AFTER sets the loss bound.")
      .def_property_readonly(
          "lost",
          [](Membership& membership) {
            py::gil_scoped_release without_gil;  // it may wait for a shrink's roll call, and the store
            return membership.lost_now();
          },
          "The lost ranks agreed so far (reads the store for rounds other survivors fixed).")
      .def_property_readonly("lost_after_s", [](const Membership& membership) {
        return membership.lost_after().count() / 1000.0;
      })
      .def(
          "agree_on_loss", [](Membership& membership) { return membership.agree_on_loss(std::chrono::steady_clock::now()); },
          py::call_guard<py::gil_scoped_release>(),
          "Waits until every rank has pulsed or is lost (at most the loss bound); returns the agreed lost ranks.")
      .def("poll_loss", &Membership::poll_loss, py::call_guard<py::gil_scoped_release>(),
           "Without waiting: opens the next round if more ranks are lost; returns the agreed lost ranks.")
      .def("roll_call", &Membership::roll_call, py::arg("excluded"), py::call_guard<py::gil_scoped_release>(),
           "Before a shrink leaving out `excluded` (sorted): checks it and waits for every survivor; returns the round.")
      .def("decide_shrink", &Membership::decide_shrink, py::arg("round"), py::arg("attempt"), py::arg("excluded"),
           py::arg("built"), py::call_guard<py::gil_scoped_release>(),
           "After the survivors built (or failed to build) the shrunk group of (round, attempt): whether it is "
           "committed, the same on every survivor.");

  py::class_<RingReduceBackend, c10d::Backend, c10::intrusive_ptr<RingReduceBackend>>(
      m, "Backend", "The torch.distributed backend \"ringreduce\" (registered by ringreduce.backend).")
      .def_property_readonly("membership", &RingReduceBackend::membership)
      .def("watch", &RingReduceBackend::watch, py::arg("communicator"),
           "Makes a communicator of the package's calls on this group follow the membership: its failures name the "
           "lost ranks, and a loss ends its waits. Call before its first collective.")
      .def_property_readonly("store", &RingReduceBackend::store)
      .def_property_readonly("timeout_s", [](const RingReduceBackend& backend) {
        return backend.timeout().count() / 1000.0;
      })
      .def(py::init([](c10d::Store& store, int rank, int size, double timeout_s,
                       const std::shared_ptr<Communicator>& cpu, c10d::Backend& fallback,
                       c10d::Backend* cuda_fallback, int algorithm_code,
                       bool announce, std::shared_ptr<Membership> membership, int compression_code) {
             if (algorithm_code < 0 || algorithm_code > static_cast<int>(Algorithm::Auto)) throw py::value_error("bad algorithm code");
             return c10::make_intrusive<RingReduceBackend>(c10::intrusive_ptr<c10d::Store>::reclaim_copy(&store), rank,
                                                           size, to_millis(timeout_s), cpu,
                                                           c10::intrusive_ptr<c10d::Backend>::reclaim_copy(&fallback),
                                                           cuda_fallback == nullptr
                                                               ? c10::intrusive_ptr<c10d::Backend>()
                                                               : c10::intrusive_ptr<c10d::Backend>::reclaim_copy(cuda_fallback),
                                                           static_cast<Algorithm>(algorithm_code), announce,
                                                           std::move(membership),
                                                           checked_compression(compression_code));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"), py::arg("cpu"),
           py::arg("fallback"), py::arg("cuda_fallback"), py::arg("algorithm"), py::arg("announce") = false,
           py::arg("membership") = nullptr, py::arg("compression") = 0,
           "`cuda_fallback` (or None) serves the delegated ops on CUDA tensors; with `announce`, the first "
           "delegation of each op is said under RINGREDUCE_DEBUG=INFO. `compression` (RINGREDUCE_COMPRESS) "
           "compresses float32 SUM and AVG all-reduces and reduce-scatters between hosts.");
  bind_checked_calls(m);
  bind_parameter_server(m);
  bind_testing(m);
}
