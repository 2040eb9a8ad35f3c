// strata::store (private) — completion-driven transfers (piece_pipeline.hpp).
#include "piece_pipeline.hpp"

#include <memory>

namespace strata::store_detail {

namespace {

/// The state of one run_pieces() call, kept alive by the callbacks it registers.
class PieceRun : public std::enable_shared_from_this<PieceRun> {
 public:
  explicit PieceRun(PieceSteps s)
      : s_(std::move(s)), loaded_(s_.count, 0), slot_busy_(s_.window, 0) {}

  Future<void> start() {
    Future<void> f = done_.future();
    start_more();
    return f;
  }

 private:
  void start_more() {
    for (;;) {
      uint64_t i;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_.status().ok() || next_start_ >= s_.count) break;
        if (s_.window != 0 && slot_busy_[next_start_ % s_.window]) break;
        i = next_start_++;
        if (s_.window != 0) slot_busy_[i % s_.window] = 1;
        ++outstanding_;
      }
      auto self = shared_from_this();
      Future<uint64_t> f = s_.load ? s_.load(i) : make_ready_future(Result<uint64_t>(0));
      f.on_ready([self, i](const Result<uint64_t>& r) { self->loaded(i, r.status()); });
    }
    maybe_finish();
  }

  void loaded(uint64_t i, const Status& st) {
    error_.note(i, st);
    {
      std::lock_guard<std::mutex> lk(mu_);
      --outstanding_;
      loaded_[i] = 1;
    }
    if (s_.cpu != nullptr) {
      s_.cpu->submit([self = shared_from_this()] { self->process_ready(); });
    } else {
      process_ready();
    }
  }

  // In piece order, one thread at a time: whoever finds the next piece loaded processes it
  // (and the ones after it that are loaded too).
  void process_ready() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (processing_) return;
      processing_ = true;
    }
    for (;;) {
      uint64_t i;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (next_process_ >= next_start_ || !loaded_[next_process_]) {
          processing_ = false;
          break;
        }
        i = next_process_++;
      }
      bool ok = error_.status().ok();
      if (ok && s_.process) {
        Status st = s_.process(i);
        error_.note(i, st);
        ok = st.ok();
      }
      if (ok && s_.store) {
        {
          std::lock_guard<std::mutex> lk(mu_);
          ++outstanding_;
        }
        auto self = shared_from_this();
        s_.store(i).on_ready([self, i](const Result<uint64_t>& r) { self->stored(i, r.status()); });
      } else {
        free_slot(i);
      }
      start_more();
    }
    maybe_finish();
  }

  void stored(uint64_t i, const Status& st) {
    error_.note(i, st);
    {
      std::lock_guard<std::mutex> lk(mu_);
      --outstanding_;
    }
    free_slot(i);
    start_more();
  }

  void free_slot(uint64_t i) {
    if (s_.window == 0) return;
    std::lock_guard<std::mutex> lk(mu_);
    slot_busy_[i % s_.window] = 0;
  }

  void maybe_finish() {
    Status st;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (finished_ || processing_ || outstanding_ > 0 || next_process_ < next_start_) return;
      st = error_.status();
      if (st.ok() && next_start_ < s_.count) return;  // start_more() goes on
      finished_ = true;
    }
    if (st.ok() && s_.finish) st = s_.finish();
    done_.set(Result<void>(st));
  }

  PieceSteps s_;
  Promise<void> done_;
  FirstError error_;
  std::mutex mu_;
  std::vector<char> loaded_;
  std::vector<char> slot_busy_;
  uint64_t next_start_ = 0;
  uint64_t next_process_ = 0;
  uint64_t outstanding_ = 0;  // loads and stores in flight
  bool processing_ = false;
  bool finished_ = false;
};

void run_from(std::shared_ptr<std::vector<std::function<Future<void>()>>> parts, size_t k,
              std::shared_ptr<Promise<void>> done) {
  if (k == parts->size()) {
    done->set_value();
    return;
  }
  (*parts)[k]().on_ready([parts, k, done](const Result<void>& r) {
    if (!r.ok()) {
      done->set_error(r.status());
      return;
    }
    run_from(parts, k + 1, done);
  });
}

}  // namespace

Future<void> run_pieces(PieceSteps steps) {
  return std::make_shared<PieceRun>(std::move(steps))->start();
}

Future<void> run_in_sequence(std::vector<std::function<Future<void>()>> parts) {
  auto p = std::make_shared<Promise<void>>();
  Future<void> f = p->future();
  run_from(std::make_shared<std::vector<std::function<Future<void>()>>>(std::move(parts)), 0, p);
  return f;
}

Future<uint64_t> with_context(const Future<uint64_t>& f, std::string context) {
  return f.then([context = std::move(context)](const Result<uint64_t>& r) -> Result<uint64_t> {
    if (!r.ok()) return r.status().with_context(context);
    return r;
  });
}

}  // namespace strata::store_detail
