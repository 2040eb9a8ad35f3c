// Gradients attached as store objects (OffloadedOptimizer::set_grad_object): a step reads
// each sub-group's gradient slice from the object into the slot's gradient region and gives
// bit-identical masters and moments to set_grad() with the same bytes in memory -- fp32 and
// bf16 gradients, several sub-groups with a tail, several small tensors packed into one
// slot, tensors mixing object and memory gradients, clipping through grad_summary, the
// overlapped step (finish_step's rest and a redo) --; bytes_read counts the gradient; the
// errors (host tier, missing / mis-sized / mistyped objects, the gate that cannot scan an
// object) with their exact codes.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "offload_test_util.hpp"

namespace strata::optimizer {
namespace {

using namespace offload_test;

/// bf16 bits of `x`, rounded to nearest even (finite inputs).
uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

/// One gradient: its bytes (fp32 or bf16) and dtype.
struct Grad {
  DType type = DType::kFloat32;
  std::vector<float> f32;
  std::vector<uint16_t> b16;
  const void* data() const {
    return type == DType::kFloat32 ? static_cast<const void*>(f32.data())
                                   : static_cast<const void*>(b16.data());
  }
  uint64_t nbytes() const { return type == DType::kFloat32 ? f32.size() * 4 : b16.size() * 2; }
};

Grad make_grad(uint32_t t, int64_t step, uint64_t n, DType type) {
  Grad g;
  g.type = type;
  g.f32 = grad_for(t, step, n);
  if (type == DType::kBFloat16) {
    for (float x : g.f32) g.b16.push_back(to_bf16(x));
    g.f32.clear();
  }
  return g;
}

/// The tensors of a test: size, gradient dtype, and whether the object run attaches its
/// gradient as a store object (else set_grad, as in the memory run).
struct Spec {
  uint64_t numel;
  DType type;
  bool object;
};

// sub_group_numel 5000: slots of 5120 elements per stream. 23456 = 4 sub-groups + a tail of
// 3456; 12000 (bf16) = 2 + 2000; the small ones are packed several per slot (each at a
// 4 KiB-aligned offset of the streams and of the gradient region).
constexpr uint64_t kSub = 5000;
const std::vector<Spec> kMixed = {
    {23456, DType::kFloat32, true},  {777, DType::kBFloat16, true},
    {1000, DType::kFloat32, false},  {900, DType::kFloat32, true},
    {12000, DType::kBFloat16, true}, {4000, DType::kBFloat16, false},
};

/// A store and an optimizer with `specs` as NVMe tensors (same initial values every time).
struct Run {
  TempDir dir;
  std::shared_ptr<Store> store;
  std::unique_ptr<OffloadedOptimizer> opt;
  std::vector<Spec> specs;
  std::vector<ParamHandle> h;
};

const Hyperparams kHp = {{"lr", 1e-2}, {"weight_decay", 0.01}};

std::unique_ptr<Run> make_run(const std::vector<Spec>& specs, uint64_t sub = kSub) {
  auto r = std::make_unique<Run>();
  r->store = must(Store::open(small_store_options(r->dir.path())));
  OffloadOptions oo;
  oo.sub_group_numel = sub;
  oo.num_buffers = 3;
  r->opt = must(OffloadedOptimizer::create(r->store, *builtin_rule_factory("adamw"), kHp, oo));
  r->specs = specs;
  for (uint32_t t = 0; t < specs.size(); ++t) {
    auto init = values(t, specs[t].numel);
    r->h.push_back(must(r->opt->add_param("t" + std::to_string(t), specs[t].numel, init.data(),
                                          0, Placement::kNvme)));
  }
  return r;
}

std::string grad_key(uint32_t t) { return "grads/t" + std::to_string(t); }

/// Puts `g` as the gradient object of tensor t (replacing last step's).
Status put_grad(Store& store, uint32_t t, const Grad& g, uint64_t numel) {
  PutOptions po;
  po.overwrite = true;
  po.tier = Tier::kNvme;
  return store.put(grad_key(t), g.data(), TensorDesc{g.type, {static_cast<int64_t>(numel)}}, po);
}

/// Attaches step `s`'s gradients: in memory for every tensor (`objects` false) or as store
/// objects for the tensors whose Spec says so.
void attach(Run& r, int64_t s, bool objects, std::vector<Grad>& keep) {
  keep.clear();
  for (uint32_t t = 0; t < r.specs.size(); ++t) {
    keep.push_back(make_grad(t, s, r.specs[t].numel, r.specs[t].type));
  }
  for (uint32_t t = 0; t < r.specs.size(); ++t) {
    if (objects && r.specs[t].object) {
      OFFLOAD_ASSERT_OK(put_grad(*r.store, t, keep[t], r.specs[t].numel));
      OFFLOAD_ASSERT_OK(r.opt->set_grad_object(r.h[t], grad_key(t), r.specs[t].type));
    } else {
      OFFLOAD_ASSERT_OK(r.opt->set_grad(r.h[t], keep[t].data(), r.specs[t].type));
    }
  }
}

/// Masters and moments of every tensor of `a` and `b` bit-identical.
void expect_same(Run& a, Run& b, const std::string& when) {
  for (uint32_t t = 0; t < a.specs.size(); ++t) {
    Status sa, sb;
    auto da = dump(*a.opt, a.h[t], &sa);
    auto db = dump(*b.opt, b.h[t], &sb);
    OFFLOAD_ASSERT_OK(sa);
    OFFLOAD_ASSERT_OK(sb);
    ASSERT_EQ(da.size(), 3u);
    ASSERT_TRUE(bit_equal(da[0], db[0])) << "master of t" << t << " " << when;
    ASSERT_TRUE(bit_equal(da[1], db[1])) << "exp_avg of t" << t << " " << when;
    ASSERT_TRUE(bit_equal(da[2], db[2])) << "exp_avg_sq of t" << t << " " << when;
    EXPECT_EQ(*a.opt->step_count(a.h[t]), *b.opt->step_count(b.h[t])) << "t" << t;
  }
}

uint64_t grad_object_bytes(const Run& r) {
  uint64_t n = 0;
  for (const auto& s : r.specs) n += s.object ? s.numel * dtype_size(s.type) : 0;
  return n;
}

uint64_t state_bytes(const Run& r) {
  uint64_t n = 0;
  for (const auto& s : r.specs) n += s.numel * 12;  // master + 2 moments, fp32
  return n;
}

StepOptions no_scan() {
  StepOptions so;
  so.max_grad_norm = 0.0;
  so.skip_if_nonfinite = false;
  return so;
}

/// `steps` steps of the memory run and the object run with the same gradients, compared
/// after each; the object run's bytes_read exceeds the memory run's by the gradients'.
void run_parity(const std::vector<Spec>& specs, int steps) {
  auto mem = make_run(specs), obj = make_run(specs);
  ASSERT_NE(mem, nullptr);
  ASSERT_NE(obj, nullptr);
  std::vector<Grad> gm, go;
  for (int s = 1; s <= steps; ++s) {
    attach(*mem, s, false, gm);
    attach(*obj, s, true, go);
    auto rm = mem->opt->step(no_scan());
    auto ro = obj->opt->step(no_scan());
    ASSERT_TRUE(rm.ok()) << rm.status().to_string();
    ASSERT_TRUE(ro.ok()) << ro.status().to_string();
    EXPECT_EQ(ro->tensors_updated, specs.size());
    EXPECT_EQ(rm->bytes_read, state_bytes(*mem));
    EXPECT_EQ(ro->bytes_read, state_bytes(*obj) + grad_object_bytes(*obj));
    EXPECT_EQ(ro->bytes_written, rm->bytes_written);
    EXPECT_EQ(ro->sub_groups, rm->sub_groups);
    expect_same(*mem, *obj, "after step " + std::to_string(s));
  }
  EXPECT_EQ(obj->opt->stats().bytes_read,
            static_cast<uint64_t>(steps) * (state_bytes(*obj) + grad_object_bytes(*obj)));
}

TEST(OffloadGradObject, Fp32GradientEqualsMemoryGradient) {
  run_parity({{23456, DType::kFloat32, true}}, 3);
}

TEST(OffloadGradObject, Bf16GradientEqualsMemoryGradient) {
  run_parity({{23456, DType::kBFloat16, true}}, 3);
}

TEST(OffloadGradObject, MixedObjectAndMemoryGradientsEqualMemory) {
  run_parity(kMixed, 3);
}

TEST(OffloadGradObject, Fp16GradientAndSubGroupLargerThanTensor) {
  // One sub-group (the whole tensor) per item, fp16.
  auto mem = make_run({{3000, DType::kFloat16, true}}, 1u << 14);
  auto obj = make_run({{3000, DType::kFloat16, true}}, 1u << 14);
  std::vector<uint16_t> g(3000);
  for (int s = 1; s <= 2; ++s) {
    // Finite fp16 bit patterns of magnitude < 1 (exponent field <= 14), either sign.
    for (size_t i = 0; i < g.size(); ++i) {
      const uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(s + 3);
      g[i] = static_cast<uint16_t>(((x >> 20) & 0x3BFFu) | ((x >> 40) & 0x8000u));
    }
    OFFLOAD_ASSERT_OK(mem->opt->set_grad(0, g.data(), DType::kFloat16));
    PutOptions po;
    po.overwrite = true;
    OFFLOAD_ASSERT_OK(obj->store->put("g16", g.data(), TensorDesc{DType::kFloat16, {3000}}, po));
    OFFLOAD_ASSERT_OK(obj->opt->set_grad_object(0, "g16", DType::kFloat16));
    OFFLOAD_ASSERT_OK(mem->opt->step(no_scan()));
    auto st = obj->opt->step(no_scan());
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    EXPECT_EQ(st->bytes_read, 3000u * 12 + 3000u * 2);
    expect_same(*mem, *obj, "fp16 step " + std::to_string(s));
  }
}

TEST(OffloadGradObject, ClippingWithGradSummaryEqualsScannedMemoryStep) {
  // The memory run scans its gradients (norm ~ 50: clipped to 1); the object run is given
  // that norm as grad_summary and makes the same decision.
  auto mem = make_run(kMixed), obj = make_run(kMixed);
  std::vector<Grad> gm, go;
  for (int s = 1; s <= 2; ++s) {
    attach(*mem, s, false, gm);
    attach(*obj, s, true, go);
    StepOptions so;
    so.max_grad_norm = 1.0;
    auto rm = mem->opt->step(so);
    ASSERT_TRUE(rm.ok()) << rm.status().to_string();
    ASSERT_LT(rm->clip_coef, 1.0);
    StepOptions::GradSummary sum;
    sum.grad_norm = rm->grad_norm;
    sum.nonfinite = false;
    so.grad_summary = sum;
    auto ro = obj->opt->step(so);
    ASSERT_TRUE(ro.ok()) << ro.status().to_string();
    EXPECT_EQ(ro->clip_coef, rm->clip_coef);
    expect_same(*mem, *obj, "clipped step " + std::to_string(s));
  }
}

TEST(OffloadGradObject, RawByteObjectsAndOtherShapesAreAccepted) {
  auto r = make_run({{6000, DType::kFloat32, true}});
  auto g = grad_for(0, 1, 6000);
  PutOptions po;
  OFFLOAD_ASSERT_OK(r->store->put("raw", g.data(), TensorDesc::bytes(6000 * 4), po));
  OFFLOAD_ASSERT_OK(r->store->put("2d", g.data(), TensorDesc{DType::kFloat32, {60, 100}}, po));
  OFFLOAD_ASSERT_OK(r->opt->set_grad_object(0, "raw", DType::kFloat32));
  OFFLOAD_ASSERT_OK(r->opt->set_grad_object(0, "2d", DType::kFloat32));
  EXPECT_TRUE(r->opt->param_info(0)->has_grad);
}

TEST(OffloadGradObject, ErrorsAtAttach) {
  TempDir dir;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  OffloadOptions oo;
  oo.sub_group_numel = kSub;
  auto opt = must(OffloadedOptimizer::create(store, *builtin_rule_factory("adam"), kHp, oo));
  ParamHandle nv = must(opt->add_param("nv", 1000, nullptr, 0, Placement::kNvme));
  ParamHandle host = must(opt->add_param("hosted", 1000, nullptr, 0, Placement::kHost));
  std::vector<float> g(1000, 0.25f);
  PutOptions po;
  OFFLOAD_ASSERT_OK(store->put("g32", g.data(), TensorDesc{DType::kFloat32, {1000}}, po));
  OFFLOAD_ASSERT_OK(store->put("short", g.data(), TensorDesc{DType::kFloat32, {999}}, po));
  OFFLOAD_ASSERT_OK(store->put("f16", g.data(), TensorDesc{DType::kFloat16, {1000}}, po));

  Status st = opt->set_grad_object(host, "g32", DType::kFloat32);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("'hosted'"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("host-tier"), std::string::npos) << st.to_string();

  st = opt->set_grad_object(nv, "absent", DType::kFloat32);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
  EXPECT_NE(st.message().find("'absent'"), std::string::npos) << st.to_string();

  st = opt->set_grad_object(nv, "short", DType::kFloat32);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("'short' holds 3996 bytes, the gradient 4000"), std::string::npos)
      << st.to_string();

  // 2000 bytes: the size of 1000 bf16, but recorded as fp16.
  st = opt->set_grad_object(nv, "f16", DType::kBFloat16);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("'f16'"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("holds fp16[1000], not bf16"), std::string::npos) << st.to_string();
  // The right size for fp32 elements but another dtype recorded.
  st = opt->set_grad_object(nv, "g32", DType::kBFloat16);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();

  EXPECT_EQ(opt->set_grad_object(nv, "g32", DType::kFloat64).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(opt->set_grad_object(nv, "", DType::kFloat32).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(opt->set_grad_object(7, "g32", DType::kFloat32).code(), StatusCode::kOutOfRange);
  // None of these attached anything.
  EXPECT_FALSE(opt->param_info(nv)->has_grad);
  EXPECT_FALSE(opt->param_info(host)->has_grad);

  OFFLOAD_ASSERT_OK(opt->set_grad_object(nv, "g32", DType::kFloat32));
  EXPECT_TRUE(opt->param_info(nv)->has_grad);
  // A failed attach keeps the previous gradient.
  EXPECT_EQ(opt->set_grad_object(nv, "short", DType::kFloat32).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(opt->param_info(nv)->has_grad);
  OFFLOAD_ASSERT_OK(opt->close());
  EXPECT_EQ(opt->set_grad_object(nv, "g32", DType::kFloat32).code(),
            StatusCode::kFailedPrecondition);
}

TEST(OffloadGradObject, GateThatWouldScanAnObjectIsRefusedBeforeAnyChange) {
  auto r = make_run(kMixed);
  std::vector<Grad> g;
  attach(*r, 1, true, g);
  std::vector<std::vector<std::vector<float>>> before;
  for (ParamHandle h : r->h) before.push_back(dump(*r->opt, h));

  auto st = r->opt->step();  // skip_if_nonfinite (default) scans every gradient
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("'t0'"), std::string::npos) << st.status().to_string();
  EXPECT_NE(st.status().message().find("grad_summary"), std::string::npos);
  EXPECT_NE(st.status().message().find("skip_if_nonfinite"), std::string::npos);

  StepOptions clip = no_scan();
  clip.max_grad_norm = 1.0;
  st = r->opt->step(clip);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("max_grad_norm"), std::string::npos);

  for (uint32_t t = 0; t < r->h.size(); ++t) {
    auto now = dump(*r->opt, r->h[t]);
    for (size_t k = 0; k < now.size(); ++k) EXPECT_TRUE(bit_equal(now[k], before[t][k]));
    EXPECT_EQ(*r->opt->step_count(r->h[t]), 0);
  }
  EXPECT_EQ(r->opt->stats().steps, 0u);
  // With grad_summary the same options run (the summary decides: not finite -> skipped).
  StepOptions::GradSummary bad;
  bad.nonfinite = true;
  StepOptions so;
  so.grad_summary = bad;
  auto sk = r->opt->step(so);
  ASSERT_TRUE(sk.ok()) << sk.status().to_string();
  EXPECT_TRUE(sk->skipped);
  so.grad_summary->nonfinite = false;
  auto ok = r->opt->step(so);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_FALSE(ok->skipped);
  EXPECT_EQ(*r->opt->step_count(r->h[0]), 1);
  OFFLOAD_ASSERT_OK(r->opt->checkpoint());  // nothing broken
}

TEST(OffloadGradObject, ObjectChangedAfterAttachIsCaughtByTheStep) {
  auto r = make_run({{6000, DType::kFloat32, true}});
  auto g = grad_for(0, 1, 6000);
  PutOptions po;
  po.overwrite = true;
  OFFLOAD_ASSERT_OK(r->store->put("g", g.data(), TensorDesc{DType::kFloat32, {6000}}, po));
  OFFLOAD_ASSERT_OK(r->opt->set_grad_object(0, "g", DType::kFloat32));
  OFFLOAD_ASSERT_OK(r->store->put("g", g.data(), TensorDesc{DType::kFloat32, {5999}}, po));
  auto st = r->opt->step(no_scan());
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument) << st.status().to_string();
  OFFLOAD_ASSERT_OK(r->store->remove("g"));
  st = r->opt->step(no_scan());
  EXPECT_EQ(st.status().code(), StatusCode::kNotFound) << st.status().to_string();
  EXPECT_EQ(*r->opt->step_count(0), 0);
  OFFLOAD_ASSERT_OK(r->opt->checkpoint());  // refused up front: nothing is broken
}

TEST(OffloadGradObject, SetGradAndClearGradsReplaceOrDetachTheObject) {
  auto mem = make_run({{6000, DType::kFloat32, true}, {3000, DType::kFloat32, true}});
  auto obj = make_run({{6000, DType::kFloat32, true}, {3000, DType::kFloat32, true}});
  std::vector<Grad> gm, go;
  attach(*obj, 1, true, go);
  // set_grad(h, ptr) replaces the object: the memory gradient is used, nothing read.
  attach(*mem, 1, false, gm);
  OFFLOAD_ASSERT_OK(obj->opt->set_grad(0, gm[0].data(), DType::kFloat32));
  auto st = obj->opt->step(no_scan());
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->bytes_read, (6000u + 3000u) * 12 + 3000u * 4);
  OFFLOAD_ASSERT_OK(mem->opt->step(no_scan()));
  expect_same(*mem, *obj, "after replacing by set_grad");
  // set_grad(h, nullptr) detaches it: the tensor is not stepped.
  OFFLOAD_ASSERT_OK(obj->opt->set_grad(1, nullptr, DType::kFloat32));
  EXPECT_FALSE(obj->opt->param_info(1)->has_grad);
  st = obj->opt->step(no_scan());
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->tensors_updated, 1u);
  EXPECT_EQ(*obj->opt->step_count(1), 1);
  // clear_grads detaches objects too.
  OFFLOAD_ASSERT_OK(obj->opt->set_grad_object(1, grad_key(1), DType::kFloat32));
  obj->opt->clear_grads();
  EXPECT_FALSE(obj->opt->param_info(1)->has_grad);
  st = obj->opt->step();  // no gradient left: nothing to scan, nothing updated
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->tensors_updated, 0u);
}

TEST(OffloadGradObject, ZeroSizeTensorTakesAnEmptyObject) {
  TempDir dir;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  auto opt = must(OffloadedOptimizer::create(store, *builtin_rule_factory("adam"), kHp, {}));
  ParamHandle z = must(opt->add_param("z", 0, nullptr, 0, Placement::kNvme));
  float dummy = 0;
  OFFLOAD_ASSERT_OK(store->put("empty", &dummy, TensorDesc{DType::kBFloat16, {0}}, {}));
  OFFLOAD_ASSERT_OK(store->put("one", &dummy, TensorDesc{DType::kBFloat16, {1}}, {}));
  EXPECT_EQ(opt->set_grad_object(z, "one", DType::kBFloat16).code(), StatusCode::kInvalidArgument);
  OFFLOAD_ASSERT_OK(opt->set_grad_object(z, "empty", DType::kBFloat16));
  auto st = opt->step();  // default gate: nothing to scan in an empty gradient
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->bytes_read, 0u);
  EXPECT_EQ(*opt->step_count(z), 1);
}

TEST(OffloadGradObject, TheFirstGradientObjectAddsTheGradientRegions) {
  TempDir dir;
  std::shared_ptr<Store> store = must(Store::open(small_store_options(dir.path())));
  OffloadOptions oo;
  oo.sub_group_numel = 5000;  // 20000 bytes -> 20480 per region
  oo.num_buffers = 3;
  oo.pinned_budget_bytes = 3u * 3u * 20480u;  // the slots' streams only: fits
  auto opt = must(OffloadedOptimizer::create(store, *builtin_rule_factory("adam"), kHp, oo));
  EXPECT_EQ(opt->pinned_bytes(), 3u * 3u * 20480u);  // 3 slots x (master, 2 moments)
  const ParamHandle h = must(opt->add_param("w", 100, nullptr));
  std::vector<float> g(100, 0.5f);
  OFFLOAD_ASSERT_OK(store->put("g", g.data(), TensorDesc{DType::kFloat32, {100}}, PutOptions{}));
  OFFLOAD_ASSERT_OK(opt->set_grad_object(h, "g", DType::kFloat32));
  EXPECT_EQ(opt->pinned_bytes(), 3u * 4u * 20480u);  // + one gradient region per slot
  OFFLOAD_ASSERT_OK(opt->set_grad_object(h, "g", DType::kFloat32));
  EXPECT_EQ(opt->pinned_bytes(), 3u * 4u * 20480u);  // allocated once
  // An optimizer that never takes a gradient object: the auto sub-group under a budget is
  // what the streams alone allow (96 KiB over 4 slots x 3 streams -> 8 KiB per stream).
  OffloadOptions fit;
  fit.key_prefix = "fit/";
  fit.pinned_budget_bytes = 96u << 10;
  auto o2 = must(OffloadedOptimizer::create(store, *builtin_rule_factory("adam"), kHp, fit));
  EXPECT_EQ(o2->sub_group_numel(), 2048u);
  EXPECT_EQ(o2->pinned_bytes(), 96u << 10);
}

// ---- the overlapped step: started tensors use their EarlyGrad, object gradients the rest

TEST(OffloadGradObject, OverlappedStepRestAndRedoWithObjects) {
  // t2 and t5 (memory gradients) start early; the object tensors are updated by
  // finish_step's rest. Then a redo (finish_step with another grad_scale than begin_step's)
  // updates every tensor again, object ones included.
  for (bool redo : {false, true}) {
    SCOPED_TRACE(redo ? "redo" : "rest");
    auto mem = make_run(kMixed), obj = make_run(kMixed);
    std::vector<Grad> gm, go;
    for (int s = 1; s <= 2; ++s) {
      attach(*mem, s, false, gm);
      StepOptions fin = no_scan();
      if (redo) fin.grad_scale = 0.5f;
      OFFLOAD_ASSERT_OK(mem->opt->step(fin));

      attach(*obj, s, true, go);
      OFFLOAD_ASSERT_OK(obj->opt->begin_step(no_scan()));
      std::vector<EarlyGrad> early;
      for (uint32_t t : {2u, 5u}) {
        EarlyGrad e;
        e.param = obj->h[t];
        e.grad = go[t].data();
        e.grad_type = go[t].type;
        early.push_back(e);
      }
      OFFLOAD_ASSERT_OK(obj->opt->start_update(early));
      OFFLOAD_ASSERT_OK(obj->opt->wait_started());
      auto st = obj->opt->finish_step(fin);
      ASSERT_TRUE(st.ok()) << st.status().to_string();
      EXPECT_EQ(st->rolled_back, redo);
      EXPECT_EQ(st->tensors_started_early, 2u);
      EXPECT_EQ(st->tensors_updated, kMixed.size());
      expect_same(*mem, *obj, "overlapped step " + std::to_string(s));
    }
  }
}

TEST(OffloadGradObject, OverlappedStepThatWouldScanAnObjectFailsAndRollsBack) {
  auto r = make_run(kMixed);
  std::vector<Grad> g;
  attach(*r, 1, true, g);
  std::vector<std::vector<std::vector<float>>> before;
  for (ParamHandle h : r->h) before.push_back(dump(*r->opt, h));
  StepOptions so;  // skip_if_nonfinite: a scan
  OFFLOAD_ASSERT_OK(r->opt->begin_step(so));
  EarlyGrad e;
  e.param = r->h[2];
  e.grad = g[2].data();
  e.grad_type = g[2].type;
  OFFLOAD_ASSERT_OK(r->opt->start_update({e}));
  OFFLOAD_ASSERT_OK(r->opt->wait_started());
  auto st = r->opt->finish_step(so);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument) << st.status().to_string();
  EXPECT_NE(st.status().message().find("grad_summary"), std::string::npos);
  EXPECT_FALSE(r->opt->step_open());
  for (uint32_t t = 0; t < r->h.size(); ++t) {
    auto now = dump(*r->opt, r->h[t]);
    for (size_t k = 0; k < now.size(); ++k) {
      EXPECT_TRUE(bit_equal(now[k], before[t][k])) << "t" << t << " stream " << k;
    }
    EXPECT_EQ(*r->opt->step_count(r->h[t]), 0);
  }
  // start_update attached t2's gradient as set_grad does, replacing nothing else; after the
  // step it is detached, the object gradients stay.
  EXPECT_FALSE(r->opt->param_info(r->h[2])->has_grad);
  EXPECT_TRUE(r->opt->param_info(r->h[0])->has_grad);
  OFFLOAD_ASSERT_OK(r->opt->checkpoint());
}

TEST(OffloadGradObject, OverlappedStartUpdateReplacesAnObjectGradient) {
  auto mem = make_run(kMixed), obj = make_run(kMixed);
  std::vector<Grad> gm, go;
  attach(*mem, 1, false, gm);
  attach(*obj, 1, true, go);
  OFFLOAD_ASSERT_OK(mem->opt->step(no_scan()));
  // t0's object gradient is replaced by the same bytes in memory, started early.
  OFFLOAD_ASSERT_OK(obj->opt->begin_step(no_scan()));
  EarlyGrad e;
  e.param = obj->h[0];
  e.grad = go[0].data();
  e.grad_type = go[0].type;
  OFFLOAD_ASSERT_OK(obj->opt->start_update({e}));
  auto st = obj->opt->finish_step(no_scan());
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->tensors_started_early, 1u);
  EXPECT_EQ(st->bytes_read, state_bytes(*obj) + grad_object_bytes(*obj) - 23456u * 4);
  expect_same(*mem, *obj, "t0 started early");
  EXPECT_FALSE(obj->opt->param_info(obj->h[0])->has_grad);  // detached by finish_step
}

}  // namespace
}  // namespace strata::optimizer
