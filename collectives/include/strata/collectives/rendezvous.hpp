// strata::collectives — the rendezvous key-value store: a small TCP server and client on
// Boost.Asio (the role torch's TCPStore plays for PyTorch). Ranks use it to exchange
// Gloo's transport addresses (see GlooStore in src/) and NCCL's unique id, to count
// arrivals (add) and to find out which peer died.
//
// Wire protocol (private to this file pair; both ends are strata): each request and each
// reply is a frame `u32 length (little endian) | payload`. Values are arbitrary bytes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "strata/base/status.hpp"

namespace strata {

/// The server: holds the key-value map in memory and answers clients on one I/O thread.
/// Normally rank 0 runs it on MASTER_ADDR:MASTER_PORT (create_communicator does so).
/// Thread-safety: all members may be called from any thread.
class RendezvousServer {
 public:
  /// Binds `host`:`port` (port 0 picks a free port; see port()) and starts serving on a
  /// background thread. `host` "0.0.0.0" listens on every IPv4 interface.
  /// \error Unavailable naming host:port when the address cannot be resolved or bound
  ///     (e.g. the port is in use: errno EADDRINUSE is kept).
  static Result<std::unique_ptr<RendezvousServer>> start(const std::string& host,
                                                         uint16_t port);

  /// Stops serving and closes every connection (clients then see Unavailable).
  ~RendezvousServer();

  /// The bound TCP port.
  uint16_t port() const;

  /// Ranks that announced themselves (RendezvousClient with rank >= 0) and currently hold
  /// no open connection, in ascending order.
  std::vector<int> lost_ranks() const;

  /// Ranks that announced themselves and still hold an open connection, ascending.
  std::vector<int> connected_ranks() const;

  /// Waits until no announced rank other than those in `except` holds a connection, or
  /// `timeout` passes. Returns true when that happened. Used by rank 0 before it tears the
  /// server down, so late ranks do not lose the store under their feet.
  bool wait_until_disconnected(const std::vector<int>& except,
                               std::chrono::milliseconds timeout) const;

  class Impl;

 private:
  explicit RendezvousServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Options of a client connection. Every default is stated; none can change after connect.
struct RendezvousClientOptions {
  /// The rank this client speaks for (named in error messages and reported to the server
  /// so that lost_ranks() can say which peer died); -1 for an anonymous client.
  int rank = -1;
  /// How long connect() retries while the server is not (yet) listening. Default 30 s.
  std::chrono::milliseconds connect_timeout{30000};
  /// Default timeout of get() and wait(). Default 30 s.
  std::chrono::milliseconds timeout{30000};
};

/// A connection to a RendezvousServer.
/// Thread-safety: all members may be called concurrently; requests are serialized on the
/// one connection (a wait() holds it until it returns).
/// A dead server never causes a hang: every request has a deadline, and a closed
/// connection gives Unavailable at once.
class RendezvousClient {
 public:
  /// Connects to `host`:`port`, retrying every 50 ms for options.connect_timeout.
  /// \error Unavailable naming host:port and the rank when no connection was made in time.
  static Result<std::unique_ptr<RendezvousClient>> connect(const std::string& host,
                                                           uint16_t port,
                                                           RendezvousClientOptions options = {});
  ~RendezvousClient();

  int rank() const;
  const RendezvousClientOptions& options() const;

  /// Stores `value` (any bytes) under `key`, replacing a previous value.
  /// \error Unavailable when the server is unreachable or the connection broke.
  Status set(const std::string& key, std::string_view value);

  /// Waits until `key` exists (at most options().timeout), then returns its value.
  /// \error DeadlineExceeded naming the key and this rank on timeout; Unavailable as set().
  Result<std::string> get(const std::string& key);
  /// As get(key) with an explicit timeout.
  Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout);

  /// Waits until every key in `keys` exists, at most `timeout`.
  /// \error DeadlineExceeded naming the missing keys and this rank; Unavailable as set().
  Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  /// As wait(keys, options().timeout).
  Status wait(const std::vector<std::string>& keys);

  /// Atomically adds `delta` to the integer stored under `key` (a missing key counts as
  /// 0) and returns the new value. The value is stored as decimal text, so get() reads it.
  /// \error InvalidArgument naming the key when its value is not a decimal integer;
  ///     Unavailable as set().
  Result<int64_t> add(const std::string& key, int64_t delta);

  /// True when every key in `keys` exists now (never waits).
  /// \error Unavailable as set().
  Result<bool> check(const std::vector<std::string>& keys);

  /// Removes `key`; returns whether it existed.  \error Unavailable as set().
  Result<bool> erase(const std::string& key);

  /// Ranks that announced themselves to the server and whose connection has closed
  /// (the process exited or was killed), ascending.  \error Unavailable as set().
  Result<std::vector<int>> lost_ranks();

  /// A barrier over the store: every one of `world_size` ranks calls it with the same
  /// `name`; returns when all have arrived. Names must not be reused.
  /// \error DeadlineExceeded naming the barrier, the number arrived and the missing ranks
  ///     it can tell (lost_ranks) after `timeout`; Unavailable as set().
  Status barrier(const std::string& name, int world_size, std::chrono::milliseconds timeout);

  class Impl;

 private:
  explicit RendezvousClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
