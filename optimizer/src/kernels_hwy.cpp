// SIMD kernels of the built-in optimizers, compiled once per x86 target by Highway
// (foreach_target.h) and chosen at run time (HWY_DYNAMIC_DISPATCH).
//
// Every kernel is one pass over its streams: load param, grad (converted to fp32), states;
// update in registers; store param, states and the optional fp16/bf16 copy. The last
// partial vector goes through zero-padded stack buffers and the same vector code, so an
// element's result never depends on where a chunk starts or ends (split invariance).
//
// fp16/bf16 conversions are done here rather than with Highway 1.0.3's DemoteTo, which
// truncates bf16 and (without F16C) fp16, and whose software fp16 PromoteTo maps inf/NaN
// to finite values. Ours round to nearest even and keep inf/NaN, like torch's .to().

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstring>

#include "kernels.hpp"
#include "strata/optimizer/grad_utils.hpp"

HWY_BEFORE_NAMESPACE();
namespace strata::optimizer::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Largest vector of floats on any x86 target (AVX-512).
constexpr size_t kMaxFloatLanes = 16;

// ---- conversions -----------------------------------------------------------------------

template <DType T>
struct Elem;
template <>
struct Elem<DType::kFloat32> {
  using type = float;
};
template <>
struct Elem<DType::kFloat16> {
  using type = uint16_t;
};
template <>
struct Elem<DType::kBFloat16> {
  using type = uint16_t;
};

// Loads Lanes(d) elements of type T at base[i] as fp32.
template <DType T, class D>
HWY_INLINE hn::Vec<D> LoadAsF32(D d, const void* base, size_t i) {
  if constexpr (T == DType::kFloat32) {
    return hn::LoadU(d, static_cast<const float*>(base) + i);
  } else {
    const hn::Rebind<uint16_t, D> du16;
    const hn::RebindToUnsigned<D> du32;
    const auto h = hn::LoadU(du16, static_cast<const uint16_t*>(base) + i);
    if constexpr (T == DType::kBFloat16) {
      return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du32, h)));
    } else {
#if HWY_TARGET <= HWY_AVX2
      const hn::Rebind<hwy::float16_t, D> df16;
      return hn::PromoteTo(d, hn::BitCast(df16, h));
#else
      // Exact binary16 -> binary32, including subnormals, inf and NaN.
      const hn::RebindToSigned<D> di32;
      const auto w = hn::PromoteTo(du32, h);
      const auto sign = hn::ShiftLeft<16>(hn::And(w, hn::Set(du32, 0x8000u)));
      const auto e = hn::And(hn::ShiftRight<10>(w), hn::Set(du32, 0x1Fu));
      const auto m = hn::And(w, hn::Set(du32, 0x3FFu));
      const auto normal = hn::Or(hn::ShiftLeft<23>(hn::Add(e, hn::Set(du32, 112u))),
                                 hn::ShiftLeft<13>(m));
      const auto infnan = hn::Or(hn::Set(du32, 0x7F800000u), hn::ShiftLeft<13>(m));
      const auto sub = hn::BitCast(
          du32, hn::Mul(hn::ConvertTo(d, hn::BitCast(di32, m)), hn::Set(d, 5.9604644775390625e-8f)));
      const auto bits = hn::IfThenElse(hn::Eq(e, hn::Zero(du32)), sub,
                                       hn::IfThenElse(hn::Eq(e, hn::Set(du32, 31u)), infnan, normal));
      return hn::BitCast(d, hn::Or(bits, sign));
#endif
    }
  }
}

// Stores v as T (fp16/bf16 round to nearest even) at base[i].
template <DType T, class D>
HWY_INLINE void StoreFromF32(D d, hn::Vec<D> v, void* base, size_t i) {
  if constexpr (T == DType::kFloat32) {
    hn::StoreU(v, d, static_cast<float*>(base) + i);
  } else {
    const hn::Rebind<uint16_t, D> du16;
    const hn::RebindToUnsigned<D> du32;
    const hn::RebindToSigned<D> di32;
    uint16_t* out = static_cast<uint16_t*>(base) + i;
    const auto u = hn::BitCast(du32, v);
    if constexpr (T == DType::kBFloat16) {
      // c10::round_to_nearest_even: NaN -> 0x7FC0, else (u + 0x7FFF + lsb) >> 16.
      const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 1u));
      const auto r = hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(du32, 0x7FFFu)), lsb));
      const auto bits = hn::IfThenElse(hn::RebindMask(du32, hn::IsNaN(v)), hn::Set(du32, 0x7FC0u), r);
      hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di32, bits)), du16, out);
    } else {
#if HWY_TARGET <= HWY_AVX2
      const hn::Rebind<hwy::float16_t, D> df16;
      hn::StoreU(hn::BitCast(du16, hn::DemoteTo(df16, v)), du16, out);  // vcvtps2ph, RNE
#else
      // binary32 -> binary16, round to nearest even (F. Giesen's float_to_half_fast3_rtne).
      const auto sign = hn::And(u, hn::Set(du32, 0x80000000u));
      const auto f = hn::BitCast(di32, hn::Xor(u, sign));  // |v| bits, non-negative as int
      const auto inf_or_nan = hn::IfThenElse(hn::Gt(f, hn::Set(di32, 0x7F800000)),
                                             hn::Set(di32, 0x7E00), hn::Set(di32, 0x7C00));
      const auto magic = hn::Set(di32, 126 << 23);  // 0.5f: aligns subnormal results
      const auto denorm = hn::Sub(
          hn::BitCast(di32, hn::Add(hn::BitCast(d, f), hn::BitCast(d, magic))), magic);
      const auto odd = hn::And(hn::ShiftRight<13>(f), hn::Set(di32, 1));
      const auto norm_u = hn::Add(hn::Add(hn::BitCast(du32, f), hn::Set(du32, 0xC8000FFFu)),
                                  hn::BitCast(du32, odd));
      const auto normal = hn::BitCast(di32, hn::ShiftRight<13>(norm_u));
      const auto r = hn::IfThenElse(
          hn::Lt(f, hn::Set(di32, 0x47800000)),
          hn::IfThenElse(hn::Lt(f, hn::Set(di32, 113 << 23)), denorm, normal), inf_or_nan);
      const auto bits = hn::Or(r, hn::BitCast(di32, hn::ShiftRight<16>(sign)));
      hn::StoreU(hn::DemoteTo(du16, bits), du16, out);
#endif
    }
  }
}

// ---- the one-pass driver -------------------------------------------------------------

// Runs body(p, g, s) over every element of the spans, one vector at a time. NS state
// streams; GT grad type; CT copy type (kFloat32 = no copy).
template <DType GT, DType CT, int NS, class Body>
HWY_INLINE void ProcessVector(DF df, const Body& body, float* p, const void* g,
                              float* const* st, void* copy, size_t i) {
  VF vp = hn::LoadU(df, p + i);
  const VF vg = LoadAsF32<GT>(df, g, i);
  VF vs[NS > 0 ? NS : 1];
  for (int k = 0; k < NS; ++k) vs[k] = hn::LoadU(df, st[k] + i);
  body.template Apply<NS>(df, vp, vg, vs);
  hn::StoreU(vp, df, p + i);
  for (int k = 0; k < NS; ++k) hn::StoreU(vs[k], df, st[k] + i);
  if constexpr (CT != DType::kFloat32) StoreFromF32<CT>(df, vp, copy, i);
}

template <DType GT, DType CT, int NS, class Body>
HWY_NOINLINE void Drive(const UpdateSpans& s, const Body& body) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t n = s.numel;
  float* const p = s.param;
  float* st[NS > 0 ? NS : 1] = {};
  for (int k = 0; k < NS; ++k) st[k] = s.states[k];
  size_t i = 0;
  if (n >= 2 * N) {
    for (; i + 2 * N <= n; i += 2 * N) {
      ProcessVector<GT, CT, NS>(df, body, p, s.grad, st, s.param_copy, i);
      ProcessVector<GT, CT, NS>(df, body, p, s.grad, st, s.param_copy, i + N);
    }
  }
  for (; i + N <= n; i += N) {
    ProcessVector<GT, CT, NS>(df, body, p, s.grad, st, s.param_copy, i);
  }
  if (i == n) return;
  // Tail: same vector code on zero-padded copies.
  const size_t r = n - i;
  constexpr size_t gsize = sizeof(typename Elem<GT>::type);
  constexpr size_t csize = sizeof(typename Elem<CT>::type);
  HWY_ALIGN float bp[kMaxFloatLanes] = {};
  HWY_ALIGN float bs[NS > 0 ? NS : 1][kMaxFloatLanes] = {};
  HWY_ALIGN float bg[kMaxFloatLanes] = {};  // large enough for any grad type
  HWY_ALIGN float bc[kMaxFloatLanes] = {};
  float* bsp[NS > 0 ? NS : 1];
  std::memcpy(bp, p + i, r * sizeof(float));
  std::memcpy(bg, static_cast<const char*>(s.grad) + i * gsize, r * gsize);
  for (int k = 0; k < NS; ++k) {
    std::memcpy(bs[k], st[k] + i, r * sizeof(float));
    bsp[k] = bs[k];
  }
  ProcessVector<GT, CT, NS>(df, body, bp, bg, bsp, bc, 0);
  std::memcpy(p + i, bp, r * sizeof(float));
  for (int k = 0; k < NS; ++k) std::memcpy(st[k] + i, bs[k], r * sizeof(float));
  if constexpr (CT != DType::kFloat32) {
    std::memcpy(static_cast<char*>(s.param_copy) + i * csize, bc, r * csize);
  }
}

template <DType GT, int NS, class Body>
HWY_INLINE void DriveCopy(const UpdateSpans& s, const Body& body) {
  if (s.param_copy == nullptr) return Drive<GT, DType::kFloat32, NS>(s, body);
  if (s.param_copy_type == DType::kFloat16) return Drive<GT, DType::kFloat16, NS>(s, body);
  return Drive<GT, DType::kBFloat16, NS>(s, body);
}

template <int NS, class Body>
HWY_INLINE void DriveAny(const UpdateSpans& s, const Body& body) {
  switch (s.grad_type) {
    case DType::kFloat16:
      return DriveCopy<DType::kFloat16, NS>(s, body);
    case DType::kBFloat16:
      return DriveCopy<DType::kBFloat16, NS>(s, body);
    default:
      return DriveCopy<DType::kFloat32, NS>(s, body);
  }
}

// ---- optimizer bodies (torch.optim operation order; see optimizers.hpp) ---------------

struct AdamBody {
  VF gscale, wd, decay, b1, omb1, b2, omb2, neg_ss, inv_bc2s, eps;
  bool l2, decoupled, amsgrad;
  template <int NS>
  HWY_INLINE void Apply(DF, VF& p, VF g, VF* s) const {
    g = hn::Mul(g, gscale);
    if (l2) g = hn::MulAdd(p, wd, g);         // grad.add(param, alpha=wd)
    if (decoupled) p = hn::Mul(p, decay);     // param.mul_(1 - lr * wd)
    const VF m = hn::MulAdd(g, omb1, hn::Mul(s[0], b1));
    const VF v = hn::MulAdd(hn::Mul(g, omb2), g, hn::Mul(s[1], b2));
    s[0] = m;
    s[1] = v;
    VF vmax = v;
    if constexpr (NS == 3) {  // amsgrad
      vmax = hn::Max(s[2], v);
      s[2] = vmax;
    }
    // torch: sqrt(v) / bias_correction2_sqrt + eps; a multiply by the fp32 reciprocal
    // (<= 1 ulp apart) keeps one division per element instead of two.
    const VF denom = hn::MulAdd(hn::Sqrt(vmax), inv_bc2s, eps);
    p = hn::MulAdd(neg_ss, hn::Div(m, denom), p);  // param.addcdiv_(m, denom, -step_size)
  }
};

struct AdagradBody {
  VF gscale, wd, neg_clr, eps;
  bool l2;
  template <int NS>
  HWY_INLINE void Apply(DF, VF& p, VF g, VF* s) const {
    g = hn::Mul(g, gscale);
    if (l2) g = hn::MulAdd(p, wd, g);
    s[0] = hn::MulAdd(g, g, s[0]);                       // state_sum.addcmul_(g, g)
    const VF std_dev = hn::Add(hn::Sqrt(s[0]), eps);     // state_sum.sqrt().add_(eps)
    p = hn::MulAdd(neg_clr, hn::Div(g, std_dev), p);     // param.addcdiv_(g, std, -clr)
  }
};

struct SgdBody {
  VF gscale, wd, neg_lr, momentum, omd;
  bool l2, has_momentum, first_step, nesterov;
  template <int NS>
  HWY_INLINE void Apply(DF, VF& p, VF g, VF* s) const {
    g = hn::Mul(g, gscale);
    if (l2) g = hn::MulAdd(p, wd, g);
    if constexpr (NS == 1) {  // momentum != 0
      const VF buf = first_step ? g : hn::MulAdd(g, omd, hn::Mul(s[0], momentum));
      s[0] = buf;
      g = nesterov ? hn::MulAdd(buf, momentum, g) : buf;
    }
    p = hn::MulAdd(g, neg_lr, p);  // param.add_(d_p, alpha=-lr)
  }
};

struct LionBody {
  VF gscale, decay, lr, b1, omb1, b2, omb2;
  bool decoupled;
  template <int NS>
  HWY_INLINE void Apply(DF df, VF& p, VF g, VF* s) const {
    g = hn::Mul(g, gscale);
    const VF c = hn::MulAdd(g, omb1, hn::Mul(s[0], b1));
    if (decoupled) p = hn::Mul(p, decay);
    VF u = hn::IfThenElseZero(hn::Ne(c, hn::Zero(df)), hn::CopySign(lr, c));  // lr*sign(c)
    u = hn::IfThenElse(hn::IsNaN(c), c, u);
    p = hn::Sub(p, u);
    s[0] = hn::MulAdd(g, omb2, hn::Mul(s[0], b2));
  }
};

struct ProbeBody {
  VF gscale, zero;
  template <int NS>
  HWY_INLINE void Apply(DF, VF& p, VF g, VF* s) const {
    g = hn::Mul(g, gscale);
    p = hn::MulAdd(g, zero, p);
    for (int k = 0; k < NS; ++k) s[k] = hn::MulAdd(g, zero, s[k]);
  }
};

void Adam(const UpdateSpans& s, const AdamScalars& a) {
  const DF df;
  const AdamBody body{hn::Set(df, a.gscale), hn::Set(df, a.weight_decay), hn::Set(df, a.decay),
                      hn::Set(df, a.beta1), hn::Set(df, a.one_minus_beta1),
                      hn::Set(df, a.beta2), hn::Set(df, a.one_minus_beta2),
                      hn::Set(df, a.neg_step_size), hn::Set(df, a.inv_bias_correction2_sqrt),
                      hn::Set(df, a.eps), a.l2, a.decoupled, a.amsgrad};
  if (a.amsgrad) return DriveAny<3>(s, body);
  return DriveAny<2>(s, body);
}

void Adagrad(const UpdateSpans& s, const AdagradScalars& a) {
  const DF df;
  const AdagradBody body{hn::Set(df, a.gscale), hn::Set(df, a.weight_decay),
                         hn::Set(df, a.neg_clr), hn::Set(df, a.eps), a.l2};
  DriveAny<1>(s, body);
}

void Sgd(const UpdateSpans& s, const SgdScalars& a) {
  const DF df;
  const SgdBody body{hn::Set(df, a.gscale), hn::Set(df, a.weight_decay), hn::Set(df, a.neg_lr),
                     hn::Set(df, a.momentum), hn::Set(df, a.one_minus_dampening),
                     a.l2, a.has_momentum, a.first_step, a.nesterov};
  if (a.has_momentum) return DriveAny<1>(s, body);
  DriveAny<0>(s, body);
}

void Lion(const UpdateSpans& s, const LionScalars& a) {
  const DF df;
  const LionBody body{hn::Set(df, a.gscale), hn::Set(df, a.decay), hn::Set(df, a.lr),
                      hn::Set(df, a.beta1), hn::Set(df, a.one_minus_beta1),
                      hn::Set(df, a.beta2), hn::Set(df, a.one_minus_beta2), a.decoupled};
  DriveAny<1>(s, body);
}

void StreamProbe(const UpdateSpans& s, int num_states, float gscale) {
  const DF df;
  const VF gs = hn::Set(df, gscale), zero = hn::Zero(df);
  switch (num_states) {
    case 0: return DriveAny<0>(s, ProbeBody{gs, zero});
    case 1: return DriveAny<1>(s, ProbeBody{gs, zero});
    case 2: return DriveAny<2>(s, ProbeBody{gs, zero});
    case 3: return DriveAny<3>(s, ProbeBody{gs, zero});
    default: return DriveAny<4>(s, ProbeBody{gs, zero});
  }
}

// ---- conversions as standalone kernels ----------------------------------------------

template <DType T>
HWY_NOINLINE void LoadScaledT(const void* src, float scale, float* dst, size_t n) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF vs = hn::Set(df, scale);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(LoadAsF32<T>(df, src, i), vs), df, dst + i);
  if (i == n) return;
  constexpr size_t esize = sizeof(typename Elem<T>::type);
  HWY_ALIGN float in[kMaxFloatLanes] = {};
  HWY_ALIGN float out[kMaxFloatLanes];
  std::memcpy(in, static_cast<const char*>(src) + i * esize, (n - i) * esize);
  hn::Store(hn::Mul(LoadAsF32<T>(df, in, 0), vs), df, out);
  std::memcpy(dst + i, out, (n - i) * sizeof(float));
}

void LoadScaledGrad(const void* src, DType type, float scale, float* dst, size_t n) {
  switch (type) {
    case DType::kFloat16: return LoadScaledT<DType::kFloat16>(src, scale, dst, n);
    case DType::kBFloat16: return LoadScaledT<DType::kBFloat16>(src, scale, dst, n);
    default: return LoadScaledT<DType::kFloat32>(src, scale, dst, n);
  }
}

template <DType T>
HWY_NOINLINE void StoreConvertedT(const float* src, void* dst, size_t n) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) StoreFromF32<T>(df, hn::LoadU(df, src + i), dst, i);
  if (i == n) return;
  HWY_ALIGN float in[kMaxFloatLanes] = {};
  HWY_ALIGN uint16_t out[kMaxFloatLanes];
  std::memcpy(in, src + i, (n - i) * sizeof(float));
  StoreFromF32<T>(df, hn::Load(df, in), out, 0);
  std::memcpy(static_cast<uint16_t*>(dst) + i, out, (n - i) * sizeof(uint16_t));
}

void StoreConverted(const float* src, DType type, void* dst, size_t n) {
  if (type == DType::kFloat16) return StoreConvertedT<DType::kFloat16>(src, dst, n);
  StoreConvertedT<DType::kBFloat16>(src, dst, n);
}

// ---- reductions ---------------------------------------------------------------------

// Sum of squares of one tile (n <= kNormTileNumel): 16 fp64 lanes, element i into lane
// i % 16, then lanes added pairwise (l + l+8, l + l+4, ...). Identical on every target:
// the fp32 -> fp64 square is exact, so FMA and mul+add agree.
template <DType T>
HWY_INLINE double TileSumSquares(const void* base, size_t n) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;  // as many floats as dd has doubles
  const size_t ND = hn::Lanes(dd);
  constexpr size_t kLanes = 16;
  const size_t nacc = kLanes / ND;
  hn::Vec<decltype(dd)> acc[kLanes];
  for (size_t j = 0; j < nacc; ++j) acc[j] = hn::Zero(dd);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < nacc; ++j) {
      const auto x = hn::PromoteTo(dd, LoadAsF32<T>(dfh, base, i + j * ND));
      acc[j] = hn::MulAdd(x, x, acc[j]);
    }
  }
  if (i < n) {
    constexpr size_t esize = sizeof(typename Elem<T>::type);
    HWY_ALIGN float buf[kLanes] = {};
    std::memcpy(buf, static_cast<const char*>(base) + i * esize, (n - i) * esize);
    for (size_t j = 0; j < nacc; ++j) {
      const auto x = hn::PromoteTo(dd, LoadAsF32<T>(dfh, buf, j * ND));
      acc[j] = hn::MulAdd(x, x, acc[j]);
    }
  }
  HWY_ALIGN double lanes[kLanes];
  for (size_t j = 0; j < nacc; ++j) hn::Store(acc[j], dd, lanes + j * ND);
  for (size_t w = kLanes / 2; w >= 1; w /= 2) {
    for (size_t l = 0; l < w; ++l) lanes[l] = lanes[l] + lanes[l + w];
  }
  return lanes[0];
}

template <DType T>
HWY_NOINLINE void TileSumsT(const void* data, size_t n, double* tile_sums) {
  constexpr size_t esize = sizeof(typename Elem<T>::type);
  for (size_t b = 0, t = 0; b < n; b += kNormTileNumel, ++t) {
    const size_t len = n - b < kNormTileNumel ? n - b : kNormTileNumel;
    tile_sums[t] = TileSumSquares<T>(static_cast<const char*>(data) + b * esize, len);
  }
}

void TileSums(const void* data, DType type, size_t n, double* tile_sums) {
  switch (type) {
    case DType::kFloat16: return TileSumsT<DType::kFloat16>(data, n, tile_sums);
    case DType::kBFloat16: return TileSumsT<DType::kBFloat16>(data, n, tile_sums);
    default: return TileSumsT<DType::kFloat32>(data, n, tile_sums);
  }
}

// Any element whose exponent bits are all ones (inf or NaN).
template <class D, class T>
HWY_INLINE bool ExponentAllOnes(D d, const T* p, size_t n, T exp_mask) {
  const size_t N = hn::Lanes(d);
  const auto em = hn::Set(d, exp_mask);
  auto any = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    any = hn::Or(any, hn::VecFromMask(d, hn::Eq(hn::And(hn::LoadU(d, p + i), em), em)));
  }
  if (!hn::AllFalse(d, hn::Ne(any, hn::Zero(d)))) return true;
  for (; i < n; ++i) {
    if ((p[i] & exp_mask) == exp_mask) return true;
  }
  return false;
}

bool HasInfOrNan(const void* data, DType type, size_t n) {
  if (type == DType::kFloat32) {
    const hn::ScalableTag<uint32_t> du32;
    return ExponentAllOnes(du32, static_cast<const uint32_t*>(data), n, uint32_t{0x7F800000u});
  }
  const hn::ScalableTag<uint16_t> du16;
  const uint16_t mask = type == DType::kFloat16 ? uint16_t{0x7C00} : uint16_t{0x7F80};
  return ExponentAllOnes(du16, static_cast<const uint16_t*>(data), n, mask);
}

int64_t TargetId() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace strata::optimizer::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::optimizer::kernels {

HWY_EXPORT(Adam);
HWY_EXPORT(Adagrad);
HWY_EXPORT(Sgd);
HWY_EXPORT(Lion);
HWY_EXPORT(StreamProbe);
HWY_EXPORT(LoadScaledGrad);
HWY_EXPORT(StoreConverted);
HWY_EXPORT(TileSums);
HWY_EXPORT(HasInfOrNan);
HWY_EXPORT(TargetId);

void adam(const UpdateSpans& s, const AdamScalars& a) { HWY_DYNAMIC_DISPATCH(Adam)(s, a); }
void adagrad(const UpdateSpans& s, const AdagradScalars& a) {
  HWY_DYNAMIC_DISPATCH(Adagrad)(s, a);
}
void sgd(const UpdateSpans& s, const SgdScalars& a) { HWY_DYNAMIC_DISPATCH(Sgd)(s, a); }
void lion(const UpdateSpans& s, const LionScalars& a) { HWY_DYNAMIC_DISPATCH(Lion)(s, a); }
void stream_probe(const UpdateSpans& s, int num_states, float gscale) {
  HWY_DYNAMIC_DISPATCH(StreamProbe)(s, num_states, gscale);
}
void load_scaled_grad(const void* src, DType type, float scale, float* dst, size_t n) {
  HWY_DYNAMIC_DISPATCH(LoadScaledGrad)(src, type, scale, dst, n);
}
void store_converted(const float* src, DType type, void* dst, size_t n) {
  HWY_DYNAMIC_DISPATCH(StoreConverted)(src, type, dst, n);
}
void tile_sum_squares(const void* data, DType type, size_t n, double* tile_sums) {
  HWY_DYNAMIC_DISPATCH(TileSums)(data, type, n, tile_sums);
}
bool has_inf_or_nan(const void* data, DType type, size_t n) {
  return HWY_DYNAMIC_DISPATCH(HasInfOrNan)(data, type, n);
}
int64_t dispatched_target() { return HWY_DYNAMIC_DISPATCH(TargetId)(); }

}  // namespace strata::optimizer::kernels
#endif  // HWY_ONCE
