// strata::store (private) — group commit: one committer thread makes the data durable
// (fdatasync of the data files written since the last batch), applies a batch of catalog
// ops in one SQLite transaction, then their in-memory effects in the same order.
#include "store_impl.hpp"

namespace strata::store_detail {

Future<void> StoreImpl::enqueue_commit(std::vector<catalog::Op> ops,
                                       std::function<void(bool)> on_done) {
  auto req = std::make_shared<CommitReq>();
  req->ops = std::move(ops);
  req->on_done = std::move(on_done);
  Future<void> f = req->promise.future();
  {
    std::lock_guard<std::mutex> lk(commit_mu_);
    commit_q_.push_back(req);
  }
  commit_cv_.notify_one();
  return f;
}

void StoreImpl::committer_loop() {
  for (;;) {
    std::vector<std::shared_ptr<CommitReq>> batch;
    {
      std::unique_lock<std::mutex> lk(commit_mu_);
      commit_cv_.wait(lk, [&] { return commit_stop_ || !commit_q_.empty(); });
      if (commit_q_.empty()) return;
      batch.assign(commit_q_.begin(), commit_q_.end());
      commit_q_.clear();
    }
    // 1. Data first: fdatasync every data file written since the last batch. Every op in
    //    the batch was enqueued after its writes completed, and marked its directories
    //    before submitting them.
    Status st;
    std::vector<Future<void>> syncs;
    for (size_t d = 0; d < files_.size(); ++d) {
      if (dir_dirty_[d].exchange(false)) syncs.push_back(io(d).sync_async(files_[d]));
    }
    for (auto& f : syncs) {
      const auto& r = f.result();
      if (st.ok() && !r.ok()) st = r.status().with_context("fdatasync before catalog commit");
    }
    // 2. Then the rows, all in one transaction. When the file system is full (SQLite
    //    needs room for its write-ahead log even to delete rows), give back the data
    //    files' growth slack and retry; then the catalog ballast (see open). Without
    //    this a full disk would leave a store where not even remove() can commit.
    if (st.ok()) {
      std::vector<catalog::Op> all;
      for (auto& r : batch) all.insert(all.end(), r->ops.begin(), r->ops.end());
      st = catalog_->apply(all);
      if (st.code() == StatusCode::kResourceExhausted) {
        trim_data_files();
        give_back_free_space(/*keep_warm=*/false);  // the warm reserve too
        st = catalog_->apply(all);
      }
      if (st.code() == StatusCode::kResourceExhausted && release_ballast()) {
        st = catalog_->apply(all);
      }
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& r : batch) {
        if (r->on_done) r->on_done(st.ok());
      }
    }
    for (auto& r : batch) {
      r->on_done = nullptr;  // drop captured versions (and their extents) before waking waiters
      r->ops.clear();
    }
    if (st.ok()) give_back_free_space(/*keep_warm=*/true);  // e.g. the originals just released
    if (st.ok() && ballast_missing_.load()) {
      trim_data_files();  // removes may have freed the end of a data file
      restore_ballast();
    }
    if (!st.ok()) {
      // The data may be durable but no row names it: mark everything dirty again so a
      // retry syncs (cheap) and report the error to every request of the batch.
      for (size_t d = 0; d < files_.size(); ++d) dir_dirty_[d].store(true);
    }
    for (auto& r : batch) r->promise.set(Result<void>(st));
  }
}

}  // namespace strata::store_detail
