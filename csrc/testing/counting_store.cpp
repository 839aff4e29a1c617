#include <torch/extension.h>

#include "testing/counting_store.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

namespace ringreduce {
namespace {

namespace py = pybind11;

class CountingStore final : public c10d::Store {
 public:
  // `requests` is shared by the store's clones: a rank's count covers every handle it opens. Each
  // request waits `delay` before it is forwarded: a slow store.
  CountingStore(c10::intrusive_ptr<c10d::Store> inner, std::shared_ptr<std::atomic<std::int64_t>> requests,
                std::chrono::milliseconds delay)
      : Store(inner->getTimeout()), inner_(std::move(inner)), requests_(std::move(requests)), delay_(delay) {}

  std::int64_t requests() const { return requests_->load(); }

  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::make_intrusive<CountingStore>(inner_->clone(), requests_, delay_);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    counted();
    inner_->set(key, value);
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& current,
                                  const std::vector<uint8_t>& desired) override {
    counted();
    return inner_->compareSet(key, current, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    counted();
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override {
    counted();
    return inner_->add(key, value);
  }
  bool deleteKey(const std::string& key) override {
    counted();
    return inner_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    counted();
    return inner_->check(keys);
  }
  int64_t getNumKeys() override {
    counted();
    return inner_->getNumKeys();
  }
  void wait(const std::vector<std::string>& keys) override {
    counted();
    inner_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    counted();
    inner_->wait(keys, timeout);
  }
  void setTimeout(const std::chrono::milliseconds& timeout) override {
    Store::setTimeout(timeout);
    inner_->setTimeout(timeout);
  }
  void append(const std::string& key, const std::vector<uint8_t>& value) override {
    counted();
    inner_->append(key, value);
  }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    counted();
    return inner_->multiGet(keys);
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override {
    counted();
    inner_->multiSet(keys, values);
  }
  bool hasExtendedApi() const override { return inner_->hasExtendedApi(); }

 private:
  void counted() {
    requests_->fetch_add(1);
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
  }

  c10::intrusive_ptr<c10d::Store> inner_;
  std::shared_ptr<std::atomic<std::int64_t>> requests_;
  std::chrono::milliseconds delay_;
};

}  // namespace

void bind_counting_store(py::module_& module) {
  py::class_<CountingStore, c10d::Store, c10::intrusive_ptr<CountingStore>>(
      module, "CountingStore",
      "A store that forwards every call to `inner` and counts them (its clones too), each `delay_s` late.")
      .def(py::init([](c10d::Store& inner, double delay_s) {
             return c10::make_intrusive<CountingStore>(c10::intrusive_ptr<c10d::Store>::reclaim_copy(&inner),
                                                       std::make_shared<std::atomic<std::int64_t>>(0),
                                                       std::chrono::milliseconds(static_cast<std::int64_t>(delay_s * 1000)));
           }),
           py::arg("inner"), py::arg("delay_s") = 0.0)
      .def_property_readonly("requests", &CountingStore::requests, "Requests forwarded so far, by it and its clones.");
}

}  // namespace ringreduce
