// Adapts a troupe Store to gloo's rendezvous::Store: blocking get and both
// wait overloads honour one deadline. Includes gloo headers: keep it out of
// widely included headers.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/store.hpp"

namespace troupe::comm {

class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<comm::Store> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_->get(key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, std::min(timeout, timeout_));
  }

 private:
  std::shared_ptr<comm::Store> store_;
  std::chrono::milliseconds timeout_;
};

}  // namespace troupe::comm
