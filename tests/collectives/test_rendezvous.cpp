// The rendezvous key-value store: set/get/wait/add/check, timeouts, dead server.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "strata/collectives/rendezvous.hpp"

using namespace strata;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<RendezvousServer> start_server() {
  auto s = RendezvousServer::start("127.0.0.1", 0);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(*s);
}

std::unique_ptr<RendezvousClient> connect(uint16_t port, int rank = -1,
                                          std::chrono::milliseconds timeout = 3000ms) {
  RendezvousClientOptions o;
  o.rank = rank;
  o.timeout = timeout;
  o.connect_timeout = timeout;
  auto c = RendezvousClient::connect("127.0.0.1", port, o);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return std::move(*c);
}

}  // namespace

TEST(Rendezvous, SetGetCheckEraseBinaryValues) {
  auto server = start_server();
  auto a = connect(server->port());
  auto b = connect(server->port());
  std::string value("a\0b\xff", 4);
  ASSERT_TRUE(a->set("k", value).ok());
  auto got = b->get("k");
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, value);
  EXPECT_EQ(*b->check({"k"}), true);
  EXPECT_EQ(*b->check({"k", "missing"}), false);
  ASSERT_TRUE(a->set("k", "second").ok());
  EXPECT_EQ(*b->get("k"), "second");
  EXPECT_EQ(*a->erase("k"), true);
  EXPECT_EQ(*a->erase("k"), false);
  EXPECT_EQ(*b->check({"k"}), false);
  ASSERT_TRUE(a->set("empty", "").ok());
  EXPECT_EQ(*b->get("empty"), "");
}

TEST(Rendezvous, WaitReturnsWhenAnotherClientSets) {
  auto server = start_server();
  auto a = connect(server->port());
  auto b = connect(server->port());
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(a->set("x", "1").ok());
    std::this_thread::sleep_for(50ms);
    ASSERT_TRUE(a->set("y", "2").ok());
  });
  auto t0 = std::chrono::steady_clock::now();
  Status s = b->wait({"x", "y"}, 3000ms);
  auto waited = std::chrono::steady_clock::now() - t0;
  setter.join();
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_GE(waited, 140ms);
  EXPECT_LT(waited, 2000ms);
  EXPECT_EQ(*b->get("y"), "2");
}

TEST(Rendezvous, WaitTimeoutNamesMissingKeyAndRank) {
  auto server = start_server();
  auto c = connect(server->port(), /*rank=*/3);
  ASSERT_TRUE(c->set("present", "1").ok());
  auto t0 = std::chrono::steady_clock::now();
  Status s = c->wait({"present", "absent/key"}, 200ms);
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("'absent/key'"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("'present'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank 3"), std::string::npos) << s.message();
  EXPECT_GE(waited, 190ms);
  EXPECT_LT(waited, 1500ms);
  auto g = c->get("nothing", 100ms);
  EXPECT_EQ(g.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(g.status().message().find("'nothing'"), std::string::npos);
  // The connection is still usable after a timeout.
  EXPECT_EQ(*c->get("present"), "1");
}

TEST(Rendezvous, AddIsAtomicAcrossThreadsAndClients) {
  auto server = start_server();
  constexpr int kThreads = 8, kAdds = 200;
  auto shared = connect(server->port());
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      // Half the threads share one client (serialized on its connection), half own one.
      std::unique_ptr<RendezvousClient> own;
      RendezvousClient* c = shared.get();
      if (t % 2) {
        own = connect(server->port());
        c = own.get();
      }
      for (int i = 0; i < kAdds; ++i) ASSERT_TRUE(c->add("counter", 1).ok());
      ASSERT_TRUE(c->add("by_thread", t).ok());
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(*shared->add("counter", 0), kThreads * kAdds);
  EXPECT_EQ(*shared->get("counter"), std::to_string(kThreads * kAdds));
  EXPECT_EQ(*shared->add("by_thread", 0), kThreads * (kThreads - 1) / 2);
  EXPECT_EQ(*shared->add("neg", -5), -5);
  ASSERT_TRUE(shared->set("text", "abc").ok());
  auto bad = shared->add("text", 1);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'text'"), std::string::npos);
}

TEST(Rendezvous, BarrierAndLostRanks) {
  auto server = start_server();
  constexpr int kRanks = 3;
  std::vector<std::unique_ptr<RendezvousClient>> cs;
  for (int r = 0; r < kRanks; ++r) cs.push_back(connect(server->port(), r));
  std::vector<std::thread> ts;
  std::atomic<int> passed{0};
  for (int r = 0; r < kRanks; ++r)
    ts.emplace_back([&, r] {
      if (cs[r]->barrier("b1", kRanks, 3000ms).ok()) ++passed;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(passed.load(), kRanks);
  EXPECT_EQ(server->connected_ranks(), (std::vector<int>{0, 1, 2}));
  cs[2].reset();  // rank 2 goes away
  std::vector<int> lost;
  for (int i = 0; i < 100 && lost.empty(); ++i) {
    lost = *cs[0]->lost_ranks();
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(lost, std::vector<int>{2});
  // A barrier that rank 2 never joins times out, naming the count and the lost rank.
  Status s = cs[0]->barrier("b2", kRanks, 200ms);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("1 of 3 ranks arrived"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("lost ranks [2]"), std::string::npos) << s.message();
}

TEST(Rendezvous, DeadServerGivesUnavailableNotAHang) {
  auto server = start_server();
  uint16_t port = server->port();
  auto c = connect(port, 1, 2000ms);
  ASSERT_TRUE(c->set("k", "v").ok());
  // A waiter blocked on the server when it dies returns at once.
  std::thread killer([&] {
    std::this_thread::sleep_for(100ms);
    server.reset();
  });
  auto t0 = std::chrono::steady_clock::now();
  Status s = c->wait({"never"}, 10000ms);
  auto waited = std::chrono::steady_clock::now() - t0;
  killer.join();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
  EXPECT_LT(waited, 2000ms);
  // Later requests fail within the timeout too.
  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c->set("k", "v").code(), StatusCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3000ms);
}

TEST(Rendezvous, ConnectToNothingTimesOut) {
  // Find a port nobody listens on: start and stop a server.
  uint16_t port;
  {
    auto s = start_server();
    port = s->port();
  }
  RendezvousClientOptions o;
  o.rank = 5;
  o.connect_timeout = 300ms;
  auto t0 = std::chrono::steady_clock::now();
  auto c = RendezvousClient::connect("127.0.0.1", port, o);
  auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos);
  EXPECT_NE(c.status().message().find("rank 5"), std::string::npos);
  EXPECT_GE(waited, 250ms);
  EXPECT_LT(waited, 2000ms);
}

TEST(Rendezvous, ServerPortInUse) {
  auto a = start_server();
  auto b = RendezvousServer::start("127.0.0.1", a->port());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(b.status().message().find(std::to_string(a->port())), std::string::npos);
}
