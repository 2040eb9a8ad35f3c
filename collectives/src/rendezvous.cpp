// The rendezvous key-value store: Asio TCP server and client (see rendezvous.hpp).
#include "strata/collectives/rendezvous.hpp"

#include <boost/asio.hpp>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

namespace strata {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// ---- wire format ----------------------------------------------------------------------
enum Op : uint8_t { kHello = 1, kSet, kGet, kWait, kAdd, kCheck, kErase, kLost };
enum Reply : uint8_t { kOk = 0, kNotFound = 1, kTimeout = 2, kBadRequest = 3, kNotInteger = 4 };
constexpr uint32_t kMaxFrame = 1u << 30;  // 1 GiB: larger frames are protocol errors
constexpr auto kWaitGrace = std::chrono::milliseconds(5000);

struct Writer {
  std::string buf = std::string(4, '\0');  // room for the length prefix
  Writer& u8(uint8_t v) { buf.push_back(static_cast<char>(v)); return *this; }
  Writer& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) buf.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& i64(int64_t v) {
    auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) buf.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    buf.append(s);
    return *this;
  }
  Writer& strs(const std::vector<std::string>& v) {
    u32(static_cast<uint32_t>(v.size()));
    for (const auto& s : v) str(s);
    return *this;
  }
  std::string frame() {
    auto n = static_cast<uint32_t>(buf.size() - 4);
    for (int i = 0; i < 4; ++i) buf[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return std::move(buf);
  }
};

struct Reader {
  std::string_view d;
  size_t pos = 0;
  bool ok = true;
  bool need(size_t n) {
    if (!ok || d.size() - pos < n) ok = false;
    return ok;
  }
  uint8_t u8() { return need(1) ? static_cast<uint8_t>(d[pos++]) : 0; }
  uint32_t u32() {
    if (!need(4)) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(d[pos + i])) << (8 * i);
    pos += 4;
    return v;
  }
  int64_t i64() {
    if (!need(8)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(d[pos + i])) << (8 * i);
    pos += 8;
    return static_cast<int64_t>(v);
  }
  std::string str() {
    uint32_t n = u32();
    if (!need(n)) return {};
    std::string s(d.substr(pos, n));
    pos += n;
    return s;
  }
  std::vector<std::string> strs() {
    uint32_t n = u32();
    std::vector<std::string> v;
    for (uint32_t i = 0; i < n && ok; ++i) v.push_back(str());
    return v;
  }
};

uint32_t decode_len(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s = "[";
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  return s + "]";
}

std::string join_ints(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string rank_tag(int rank) { return rank >= 0 ? "rank " + std::to_string(rank) : "client"; }

}  // namespace

// ---- server ---------------------------------------------------------------------------

class RendezvousServer::Impl {
 public:
  class Session;
  struct Waiter {
    std::shared_ptr<Session> session;
    std::vector<std::string> keys;
    std::unique_ptr<asio::steady_timer> timer;
    bool done = false;
  };

  class Session : public std::enable_shared_from_this<Session> {
   public:
    Session(Impl* srv, tcp::socket sock) : srv_(srv), sock_(std::move(sock)) {}
    void start() { read_header(); }
    void reply(std::string frame) {
      out_ = std::move(frame);
      auto self = shared_from_this();
      asio::async_write(sock_, asio::buffer(out_), [self](boost::system::error_code ec, size_t) {
        if (ec) return self->close();
        self->read_header();
      });
    }
    void close() {
      if (closed_) return;
      closed_ = true;
      boost::system::error_code ec;
      sock_.close(ec);
      srv_->on_closed(shared_from_this());
    }
    int rank = -1;

   private:
    void read_header() {
      auto self = shared_from_this();
      asio::async_read(sock_, asio::buffer(hdr_), [self](boost::system::error_code ec, size_t) {
        if (ec) return self->close();
        uint32_t n = decode_len(self->hdr_);
        if (n == 0 || n > kMaxFrame) return self->close();
        self->body_.resize(n);
        self->read_body();
      });
    }
    void read_body() {
      auto self = shared_from_this();
      asio::async_read(sock_, asio::buffer(body_), [self](boost::system::error_code ec, size_t) {
        if (ec) return self->close();
        self->srv_->handle(self, self->body_);
      });
    }
    Impl* srv_;
    tcp::socket sock_;
    unsigned char hdr_[4];
    std::string body_;
    std::string out_;
    bool closed_ = false;
  };

  Impl() : acceptor_(io_) {}

  Status bind(const std::string& host, uint16_t port) {
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    auto results = resolver.resolve(host, std::to_string(port), ec);
    if (ec || results.empty())
      return unavailable("rendezvous server: cannot resolve '" + host + "': " + ec.message());
    tcp::endpoint ep = results.begin()->endpoint();
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
      return Status(StatusCode::kUnavailable,
                    "rendezvous server: cannot listen on " + host + ":" + std::to_string(port) +
                        ": " + ec.message(),
                    ec.value());
    port_ = acceptor_.local_endpoint().port();
    accept();
    thread_ = std::thread([this] { io_.run(); });
    return Status::OK();
  }

  ~Impl() {
    asio::post(io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
      auto sessions = sessions_;
      for (auto& s : sessions) s->close();
    });
    // Give the close handlers a moment, then stop the loop.
    asio::post(io_, [this] { io_.stop(); });
    if (thread_.joinable()) thread_.join();
  }

  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket sock) {
      if (ec) return;  // acceptor closed
      boost::system::error_code ignored;
      sock.set_option(tcp::no_delay(true), ignored);
      auto s = std::make_shared<Session>(this, std::move(sock));
      sessions_.insert(s);
      s->start();
      accept();
    });
  }

  void on_closed(const std::shared_ptr<Session>& s) {
    sessions_.erase(s);
    for (auto& w : waiters_) {
      if (w->session == s && !w->done) {
        w->done = true;
        w->timer->cancel();
      }
    }
    waiters_.remove_if([&](const std::shared_ptr<Waiter>& w) { return w->session == s; });
    if (s->rank >= 0) {
      std::lock_guard<std::mutex> lk(mu_);
      --rank_conns_[s->rank];
    }
    cv_.notify_all();
  }

  bool has_all(const std::vector<std::string>& keys, std::vector<std::string>* missing) {
    bool all = true;
    for (const auto& k : keys) {
      if (!kv_.count(k)) {
        all = false;
        if (missing) missing->push_back(k);
      }
    }
    return all;
  }

  void wake_waiters() {
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      auto w = *it;
      if (!w->done && has_all(w->keys, nullptr)) {
        w->done = true;
        w->timer->cancel();
        it = waiters_.erase(it);
        w->session->reply(Writer().u8(kOk).frame());
      } else {
        ++it;
      }
    }
  }

  void handle(const std::shared_ptr<Session>& s, const std::string& body) {
    Reader r{body};
    uint8_t op = r.u8();
    switch (op) {
      case kHello: {
        int rank = static_cast<int>(r.i64());
        if (!r.ok) break;
        if (s->rank < 0 && rank >= 0) {
          s->rank = rank;
          std::lock_guard<std::mutex> lk(mu_);
          ++rank_conns_[rank];
        }
        return s->reply(Writer().u8(kOk).frame());
      }
      case kSet: {
        std::string key = r.str();
        std::string value = r.str();
        if (!r.ok) break;
        kv_[key] = std::move(value);
        s->reply(Writer().u8(kOk).frame());
        wake_waiters();
        return;
      }
      case kGet: {
        std::string key = r.str();
        if (!r.ok) break;
        auto it = kv_.find(key);
        if (it == kv_.end()) return s->reply(Writer().u8(kNotFound).frame());
        return s->reply(Writer().u8(kOk).str(it->second).frame());
      }
      case kErase: {
        std::string key = r.str();
        if (!r.ok) break;
        bool existed = kv_.erase(key) > 0;
        return s->reply(Writer().u8(existed ? kOk : kNotFound).frame());
      }
      case kCheck: {
        auto keys = r.strs();
        if (!r.ok) break;
        return s->reply(Writer().u8(has_all(keys, nullptr) ? kOk : kNotFound).frame());
      }
      case kAdd: {
        std::string key = r.str();
        int64_t delta = r.i64();
        if (!r.ok) break;
        int64_t cur = 0;
        auto it = kv_.find(key);
        if (it != kv_.end()) {
          const std::string& v = it->second;
          auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), cur);
          if (ec != std::errc() || p != v.data() + v.size())
            return s->reply(Writer().u8(kNotInteger).frame());
        }
        cur += delta;
        kv_[key] = std::to_string(cur);
        s->reply(Writer().u8(kOk).i64(cur).frame());
        wake_waiters();
        return;
      }
      case kWait: {
        auto keys = r.strs();
        int64_t timeout_ms = r.i64();
        if (!r.ok) break;
        if (has_all(keys, nullptr)) return s->reply(Writer().u8(kOk).frame());
        auto w = std::make_shared<Waiter>();
        w->session = s;
        w->keys = std::move(keys);
        w->timer = std::make_unique<asio::steady_timer>(io_);
        w->timer->expires_after(std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)));
        waiters_.push_back(w);
        w->timer->async_wait([this, w](boost::system::error_code ec) {
          if (ec || w->done) return;
          w->done = true;
          waiters_.remove(w);
          std::vector<std::string> missing;
          has_all(w->keys, &missing);
          w->session->reply(Writer().u8(kTimeout).strs(missing).frame());
        });
        return;
      }
      case kLost: {
        std::vector<int> lost = lost_ranks();
        Writer w;
        w.u8(kOk).u32(static_cast<uint32_t>(lost.size()));
        for (int x : lost) w.i64(x);
        return s->reply(w.frame());
      }
      default:
        break;
    }
    s->reply(Writer().u8(kBadRequest).frame());
  }

  std::vector<int> lost_ranks() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<int> v;
    for (auto [rank, n] : rank_conns_)
      if (n <= 0) v.push_back(rank);
    return v;
  }
  std::vector<int> connected_ranks() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<int> v;
    for (auto [rank, n] : rank_conns_)
      if (n > 0) v.push_back(rank);
    return v;
  }
  bool wait_until_disconnected(const std::vector<int>& except,
                               std::chrono::milliseconds timeout) const {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, timeout, [&] {
      for (auto [rank, n] : rank_conns_) {
        bool excepted = std::find(except.begin(), except.end(), rank) != except.end();
        if (n > 0 && !excepted) return false;
      }
      return true;
    });
  }

  uint16_t port_ = 0;

 private:
  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::thread thread_;
  // Touched only on the I/O thread:
  std::unordered_map<std::string, std::string> kv_;
  std::set<std::shared_ptr<Session>> sessions_;
  std::list<std::shared_ptr<Waiter>> waiters_;
  // Shared with callers of lost_ranks() & co:
  mutable std::mutex mu_;
  mutable std::condition_variable_any cv_;
  std::map<int, int> rank_conns_;
};

RendezvousServer::RendezvousServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RendezvousServer::~RendezvousServer() = default;

Result<std::unique_ptr<RendezvousServer>> RendezvousServer::start(const std::string& host,
                                                                  uint16_t port) {
  auto impl = std::make_unique<Impl>();
  STRATA_RETURN_IF_ERROR(impl->bind(host, port));
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(std::move(impl)));
}

uint16_t RendezvousServer::port() const { return impl_->port_; }
std::vector<int> RendezvousServer::lost_ranks() const { return impl_->lost_ranks(); }
std::vector<int> RendezvousServer::connected_ranks() const { return impl_->connected_ranks(); }
bool RendezvousServer::wait_until_disconnected(const std::vector<int>& except,
                                               std::chrono::milliseconds timeout) const {
  return impl_->wait_until_disconnected(except, timeout);
}

// ---- client ---------------------------------------------------------------------------

class RendezvousClient::Impl {
 public:
  Impl(std::string host, uint16_t port, RendezvousClientOptions opt)
      : host_(std::move(host)), port_(port), opt_(opt), sock_(io_) {}

  std::string where() const {
    return "rendezvous server " + host_ + ":" + std::to_string(port_) + " (" +
           rank_tag(opt_.rank) + ")";
  }

  // Runs the I/O context until `done` or `deadline`; false on timeout.
  bool run_until(const bool& done, Clock::time_point deadline) {
    while (!done) {
      if (Clock::now() >= deadline) return false;
      if (io_.stopped()) io_.restart();
      io_.run_one_until(deadline);
    }
    return true;
  }

  void abort_pending() {
    boost::system::error_code ec;
    sock_.close(ec);
    io_.restart();
    io_.run();  // lets the cancelled handlers complete
    io_.restart();
    connected_ = false;
  }

  Status connect_once(Clock::time_point deadline) {
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    auto results = resolver.resolve(host_, std::to_string(port_), ec);
    if (ec) return unavailable("cannot resolve " + where() + ": " + ec.message());
    bool done = false;
    boost::system::error_code cec;
    if (sock_.is_open()) sock_.close(ec);
    asio::async_connect(sock_, results, [&](boost::system::error_code e, const tcp::endpoint&) {
      cec = e;
      done = true;
    });
    if (!run_until(done, deadline)) {
      abort_pending();
      return unavailable("timed out connecting to " + where());
    }
    if (cec) {
      boost::system::error_code ignored;
      sock_.close(ignored);
      return Status(StatusCode::kUnavailable, "cannot connect to " + where() + ": " + cec.message(),
                    cec.value());
    }
    sock_.set_option(tcp::no_delay(true), ec);
    connected_ = true;
    return Status::OK();
  }

  Status connect_retry(std::chrono::milliseconds budget) {
    auto deadline = Clock::now() + budget;
    Status last;
    while (true) {
      auto attempt_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(2));
      last = connect_once(attempt_deadline);
      if (last.ok()) break;
      if (Clock::now() + std::chrono::milliseconds(50) >= deadline)
        return unavailable("could not reach " + where() + " within " +
                           std::to_string(budget.count()) + " ms: " + last.message());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (opt_.rank >= 0) {
      auto r = exchange(Writer().u8(kHello).i64(opt_.rank).frame(), Clock::now() + opt_.timeout,
                        "hello");
      if (!r.ok()) return r.status();
    }
    return Status::OK();
  }

  // Sends one request frame and returns the reply payload. Caller holds mu_.
  Result<std::string> exchange(const std::string& frame, Clock::time_point deadline,
                               std::string_view what) {
    if (!connected_) {
      if (ever_connected_) {
        // The connection broke earlier (server gone or a timed out request): try again once.
        auto budget = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        Status s = connect_once(Clock::now() + std::max(budget, std::chrono::milliseconds(100)));
        if (!s.ok()) return unavailable(std::string(what) + ": " + s.message());
        if (opt_.rank >= 0) {
          auto r = exchange(Writer().u8(kHello).i64(opt_.rank).frame(), deadline, "hello");
          if (!r.ok()) return r.status();
        }
      } else {
        return unavailable(std::string(what) + ": not connected to " + where());
      }
    }
    bool done = false;
    boost::system::error_code err;
    unsigned char hdr[4];
    std::string body;
    asio::async_write(sock_, asio::buffer(frame), [&](boost::system::error_code e, size_t) {
      if (e) {
        err = e;
        done = true;
        return;
      }
      asio::async_read(sock_, asio::buffer(hdr), [&](boost::system::error_code e2, size_t) {
        if (e2) {
          err = e2;
          done = true;
          return;
        }
        uint32_t n = decode_len(hdr);
        if (n == 0 || n > kMaxFrame) {
          err = asio::error::message_size;
          done = true;
          return;
        }
        body.resize(n);
        asio::async_read(sock_, asio::buffer(body), [&](boost::system::error_code e3, size_t) {
          err = e3;
          done = true;
        });
      });
    });
    if (!run_until(done, deadline)) {
      abort_pending();
      return unavailable(std::string(what) + ": no reply from " + where() +
                         " before the deadline; the server is hung or unreachable");
    }
    if (err) {
      abort_pending();
      return Status(StatusCode::kUnavailable,
                    std::string(what) + ": connection to " + where() + " failed: " + err.message() +
                        (err == asio::error::eof ? " (the server closed the connection: rank 0 "
                                                   "or the launcher hosting it exited?)"
                                                 : ""),
                    err.value());
    }
    return body;
  }

  Result<std::string> request(const std::string& frame, std::chrono::milliseconds budget,
                              std::string_view what) {
    std::lock_guard<std::mutex> lk(mu_);
    return exchange(frame, Clock::now() + budget, what);
  }

  // request() for a reply that is kOk (true) or kNotFound (false).
  Result<bool> request_found(const std::string& frame, const std::string& what);

  std::string host_;
  uint16_t port_;
  RendezvousClientOptions opt_;
  std::mutex mu_;
  asio::io_context io_;
  tcp::socket sock_;
  bool connected_ = false;
  bool ever_connected_ = false;
};

RendezvousClient::RendezvousClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RendezvousClient::~RendezvousClient() {
  boost::system::error_code ec;
  impl_->sock_.close(ec);
}

Result<std::unique_ptr<RendezvousClient>> RendezvousClient::connect(
    const std::string& host, uint16_t port, RendezvousClientOptions options) {
  auto impl = std::make_unique<Impl>(host, port, options);
  STRATA_RETURN_IF_ERROR(impl->connect_retry(options.connect_timeout));
  impl->ever_connected_ = true;
  return std::unique_ptr<RendezvousClient>(new RendezvousClient(std::move(impl)));
}

int RendezvousClient::rank() const { return impl_->opt_.rank; }
const RendezvousClientOptions& RendezvousClient::options() const { return impl_->opt_; }

static Status bad_reply(std::string_view what, const std::string& where) {
  return internal_error(std::string(what) + ": malformed reply from " + where);
}

Status RendezvousClient::set(const std::string& key, std::string_view value) {
  std::string what = "set('" + key + "')";
  STRATA_ASSIGN_OR_RETURN(std::string body,
                          impl_->request(Writer().u8(kSet).str(key).str(value).frame(),
                                         impl_->opt_.timeout, what));
  Reader r{body};
  if (r.u8() != kOk || !r.ok) return bad_reply(what, impl_->where());
  return Status::OK();
}

Status RendezvousClient::wait(const std::vector<std::string>& keys,
                              std::chrono::milliseconds timeout) {
  std::string what = "wait(" + join_keys(keys) + ")";
  STRATA_ASSIGN_OR_RETURN(
      std::string body,
      impl_->request(Writer().u8(kWait).strs(keys).i64(timeout.count()).frame(),
                     timeout + kWaitGrace, what));
  Reader r{body};
  uint8_t code = r.u8();
  if (code == kOk) return Status::OK();
  if (code == kTimeout) {
    auto missing = r.strs();
    return deadline_exceeded(rank_tag(impl_->opt_.rank) + ": timed out after " +
                             std::to_string(timeout.count()) + " ms waiting for key(s) " +
                             join_keys(missing) + " in the rendezvous store at " + impl_->host_ +
                             ":" + std::to_string(impl_->port_));
  }
  return bad_reply(what, impl_->where());
}

Status RendezvousClient::wait(const std::vector<std::string>& keys) {
  return wait(keys, impl_->opt_.timeout);
}

Result<std::string> RendezvousClient::get(const std::string& key,
                                          std::chrono::milliseconds timeout) {
  STRATA_RETURN_IF_ERROR(wait({key}, timeout));
  std::string what = "get('" + key + "')";
  STRATA_ASSIGN_OR_RETURN(std::string body,
                          impl_->request(Writer().u8(kGet).str(key).frame(), impl_->opt_.timeout,
                                         what));
  Reader r{body};
  uint8_t code = r.u8();
  if (code == kNotFound)
    return not_found(rank_tag(impl_->opt_.rank) + ": key '" + key +
                     "' was erased between wait and get");
  std::string value = r.str();
  if (code != kOk || !r.ok) return bad_reply(what, impl_->where());
  return value;
}

Result<std::string> RendezvousClient::get(const std::string& key) {
  return get(key, impl_->opt_.timeout);
}

Result<int64_t> RendezvousClient::add(const std::string& key, int64_t delta) {
  std::string what = "add('" + key + "')";
  STRATA_ASSIGN_OR_RETURN(std::string body,
                          impl_->request(Writer().u8(kAdd).str(key).i64(delta).frame(),
                                         impl_->opt_.timeout, what));
  Reader r{body};
  uint8_t code = r.u8();
  if (code == kNotInteger)
    return invalid_argument(rank_tag(impl_->opt_.rank) + ": add on key '" + key +
                            "' whose value is not a decimal integer");
  int64_t v = r.i64();
  if (code != kOk || !r.ok) return bad_reply(what, impl_->where());
  return v;
}

Result<bool> RendezvousClient::Impl::request_found(const std::string& frame,
                                                  const std::string& what) {
  STRATA_ASSIGN_OR_RETURN(std::string body, request(frame, opt_.timeout, what));
  Reader r{body};
  uint8_t code = r.u8();
  if (code == kOk) return true;
  if (code == kNotFound) return false;
  return bad_reply(what, where());
}

Result<bool> RendezvousClient::check(const std::vector<std::string>& keys) {
  return impl_->request_found(Writer().u8(kCheck).strs(keys).frame(),
                              "check(" + join_keys(keys) + ")");
}

Result<bool> RendezvousClient::erase(const std::string& key) {
  return impl_->request_found(Writer().u8(kErase).str(key).frame(), "erase('" + key + "')");
}

Result<std::vector<int>> RendezvousClient::lost_ranks() {
  STRATA_ASSIGN_OR_RETURN(std::string body, impl_->request(Writer().u8(kLost).frame(),
                                                           impl_->opt_.timeout, "lost_ranks"));
  Reader r{body};
  if (r.u8() != kOk) return bad_reply("lost_ranks", impl_->where());
  uint32_t n = r.u32();
  std::vector<int> v;
  for (uint32_t i = 0; i < n && r.ok; ++i) v.push_back(static_cast<int>(r.i64()));
  if (!r.ok) return bad_reply("lost_ranks", impl_->where());
  return v;
}

Status RendezvousClient::barrier(const std::string& name, int world_size,
                                 std::chrono::milliseconds timeout) {
  const std::string arrived = name + "/arrived";
  const std::string done = name + "/done";
  STRATA_ASSIGN_OR_RETURN(int64_t n, add(arrived, 1));
  if (n == world_size) STRATA_RETURN_IF_ERROR(set(done, "1"));
  Status s = wait({done}, timeout);
  if (s.code() != StatusCode::kDeadlineExceeded) return s;
  auto now = add(arrived, 0);
  auto lost = lost_ranks();
  return deadline_exceeded(rank_tag(impl_->opt_.rank) + ": barrier '" + name + "' timed out after " +
                           std::to_string(timeout.count()) + " ms: " +
                           (now.ok() ? std::to_string(*now) : std::string("?")) + " of " +
                           std::to_string(world_size) + " ranks arrived" +
                           (lost.ok() && !lost->empty() ? "; lost ranks " + join_ints(*lost) : ""));
}

}  // namespace strata
