#!/usr/bin/env bash
# Builds strata on a GPU machine that has none of its C++ dependencies and runs every GPU
# check there in one command (docs/gpu.md).
#
#   scripts/device-check.sh prepare   # here (Debian 12, with its package mirror): fills .device/
#   scripts/device-check.sh run       # there (the GPU machine, .device/ carried): results in $OUT
#   scripts/device-check.sh size      # what would travel to the GPU machine, in bytes
#
# prepare: `apt-get download`s the Debian 12 packages of strata's build dependencies and of
#   the runtime libraries they need into .device/debs/, builds a static fio (only the engines
#   that need no library: io_uring, psync, ...) from Debian's fio source into .device/bin/fio,
#   checks that every library in the set finds its own dependencies in the set or in the C/C++
#   runtime, and prints the size of .device/ and of all that travels (tracked and untracked,
#   not ignored files plus .device/: at most 64 MiB). Idempotent: what is there is kept.
# run: records the machine's facts; unpacks every .deb into a prefix (dpkg -x); configures
#   strata with CUDA on against that prefix (pkg-config confined to the prefix, CMake
#   packages from it, the machine's python3 with torch, pybind11 from pip, NCCL from the
#   CUDA toolkit or from pip's nvidia-nccl); builds with all cores; runs the GPU-labelled
#   tests (ctest -L gpu), the GPU benchmarks (strata bench device with fio and strata bench
#   io on the same directory, bench/gpu/device_tier.py), the real client
#   (examples/hf_gpu_train.py), strata's safetensors import/export against the real
#   safetensors and transformers packages (tests/bindings/torch_checkpoints/
#   hf_interop_check.py), torch's own optimizer test inputs (optim_db of the machine's
#   torch 2.x) against OffloadOptimizer (tests/bindings/torch_optim/test_torch_optim_db.py,
#   JUnit XML in the summary), then the rest of ctest with the time left; writes
#   $OUT/summary.json and at most 8 files in all to $OUT, and prints a short table last.
#   Without a GPU it does the same and the GPU steps skip (the summary says so).
#
# Environment of `run` (defaults in brackets):
#   OUT                      results folder [/tmp/strata-device-out]
#   STRATA_DEVICE_PREFIX     where the packages are unpacked [/tmp/strata-deps]
#   STRATA_DEVICE_BUILD      build folder [/tmp/strata-device-build]
#   STRATA_DEVICE_DATA       directory of the NVMe-tier benchmarks [/var/tmp/strata-device]
#   STRATA_DEVICE_BUDGET_S   seconds the whole run may take [540]
#   STRATA_DEVICE_JOBS       build jobs [nproc]
#   STRATA_DEVICE_NICE       niceness of the build [0]
#   STRATA_DEVICE_REST       1: the rest of ctest after the GPU checks, in the time left [1]
#   STRATA_DEVICE_LINK_ALL   1: every carried library on LD_LIBRARY_PATH, not only those the
#                            machine lacks (to test that path on a machine that has them) [0]
#   STRATA_DEVICE_PYTHON     python with torch [the first of python3, /usr/bin/python3 with torch]
#   STRATA_DEVICE_CMAKE_ARGS extra configure arguments (word-split)
#   STRATA_DEVICE_BENCH_SIZE bytes per transfer of the benchmarks [1GiB]
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEV=$ROOT/.device
ARCH=x86_64-linux-gnu
MAX_TRAVEL=$((64 * 1024 * 1024))

# Debian 12 packages: headers, static/shared libraries, pkg-config and CMake files of every
# dependency of cmake/StrataDependencies.cmake (+ tests and benchmarks), the shared
# libraries those need beyond the C/C++ runtime, and pkg-config itself.
PKGS=(
  liburing-dev liburing2
  libhwloc-dev libhwloc15 libudev1
  libxxhash-dev libxxhash0
  libhwy-dev libhwy1
  libboost1.74-dev
  nlohmann-json3-dev libcli11-dev
  libsqlite3-dev libsqlite3-0
  libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200
  libgtest-dev libgmock-dev
  libbenchmark-dev libbenchmark1debian
  pkgconf-bin libpkgconf3
)
# Shared libraries every machine that builds C++ has (glibc, libstdc++, libgcc): not carried.
BASE_SONAMES="linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2
  librt.so.1 libstdc++.so.6 libgcc_s.so.1"

say() { printf '[device-check %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { say "error: $*"; exit 1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# ------------------------------------------------------------------------------ size

# Bytes that travel: tracked + untracked-not-ignored files (as git lists them) + .device/.
travel_bytes() {
  local files dev=0
  files=$(cd "$ROOT" && { git ls-files -z; git ls-files -z --others --exclude-standard; } |
    xargs -0 -r stat -c %s -- 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
  [[ -d $DEV ]] && dev=$(du -sb "$DEV" | cut -f1)
  echo "$files $dev"
}

cmd_size() {
  read -r files dev < <(travel_bytes)
  local total=$((files + dev))
  say "working tree: $(mib "$files"); .device/: $(mib "$dev"); travels: $(mib "$total" ) of $(mib $MAX_TRAVEL)"
  ((total <= MAX_TRAVEL)) || { say "error: over the 64 MiB a call carries"; return 1; }
}

# ------------------------------------------------------------------------------ prepare

# A static fio from Debian's source package (the Debian binary links librados, librbd,
# glusterfs and 50 more libraries: about 40 MB of packages). Built once, kept in .device/bin.
build_fio() {
  local cache=${STRATA_DEVICE_CACHE:-/var/tmp/strata-device-cache}
  [[ -x $DEV/bin/fio ]] && { say "fio: $DEV/bin/fio present ($($DEV/bin/fio --version))"; return 0; }
  mkdir -p "$cache/lists/partial" "$cache/src" "$DEV/bin"
  local suite
  suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  echo "deb-src http://deb.debian.org/debian $suite main" >"$cache/sources.list"
  local o=(-o "Dir::Etc::SourceList=$cache/sources.list" -o Dir::Etc::SourceParts=/nonexistent
           -o "Dir::State::Lists=$cache/lists")
  if ! ls "$cache"/src/fio_*.orig.tar.* >/dev/null 2>&1; then
    say "fio: fetching Debian's fio source"
    apt-get "${o[@]}" -q update >/dev/null || die "apt-get update (deb-src) failed"
    (cd "$cache/src" && apt-get "${o[@]}" -q source --download-only fio >/dev/null) ||
      die "apt-get source fio failed"
  fi
  local tarball dir
  tarball=$(ls "$cache"/src/fio_*.orig.tar.* | head -1)
  rm -rf "$cache/build" && mkdir -p "$cache/build"
  tar -xf "$tarball" -C "$cache/build"
  dir=$(ls -d "$cache"/build/fio-* | head -1)
  say "fio: building $(basename "$dir") (static, engines without libraries)"
  (cd "$dir" &&
    ./configure --build-static --disable-native --disable-numa --disable-rdma --disable-rados \
      --disable-rbd --disable-http --disable-gfapi --disable-libnfs --disable-pmem \
      --disable-xnvme --disable-libzbc --disable-tcmalloc --disable-dfs >"$cache/fio-configure.log" 2>&1 &&
    nice make -j"$(nproc)" fio >"$cache/fio-build.log" 2>&1) ||
    die "fio build failed (see $cache/fio-*.log)"
  strip -o "$DEV/bin/fio" "$dir/fio"
  "$DEV/bin/fio" --enghelp | grep -qw io_uring || die "the fio built has no io_uring engine"
  say "fio: $DEV/bin/fio ($($DEV/bin/fio --version), $(mib "$(stat -c %s "$DEV/bin/fio")"))"
}

# Every NEEDED soname of every ELF file in the set: provided by the set or in BASE_SONAMES?
check_closure() {
  local tmp
  tmp=$(mktemp -d)
  for f in "$DEV"/debs/*.deb; do dpkg-deb -x "$f" "$tmp"; done
  local provided needed missing
  provided=$(find "$tmp" -name 'lib*.so*' \( -type f -o -type l \) -printf '%f\n' | sort -u)
  needed=$(find "$tmp" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec sh -c \
    'for f; do readelf -d "$f" 2>/dev/null | sed -n "s/.*(NEEDED).*\[\(.*\)\]/\1/p"; done' _ {} + |
    sort -u)
  missing=$(comm -23 <(echo "$needed") <(printf '%s\n' $provided $BASE_SONAMES | sort -u))
  rm -rf "$tmp"
  if [[ -n $missing ]]; then
    say "error: libraries of the set need sonames that are not in it: $(echo $missing)"
    return 1
  fi
  say "closure: every library of the set finds its dependencies in the set or in glibc/libstdc++"
}

cmd_prepare() {
  command -v apt-get >/dev/null || die "prepare needs apt-get (Debian 12)"
  mkdir -p "$DEV/debs"
  local missing=()
  for p in "${PKGS[@]}"; do
    ls "$DEV/debs/${p}_"*.deb >/dev/null 2>&1 || missing+=("$p")
  done
  if ((${#missing[@]})); then
    say "downloading ${#missing[@]} packages: ${missing[*]}"
    (cd "$DEV/debs" && apt-get -q download "${missing[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed') ||
      die "apt-get download failed"
  else
    say "packages: all ${#PKGS[@]} present in $DEV/debs"
  fi
  build_fio
  check_closure || return 1
  (cd "$DEV/debs" && for f in *.deb; do dpkg-deb -f "$f" Package Version | paste -sd' '; done) \
    >"$DEV/MANIFEST"
  "$DEV/bin/fio" --version | sed 's/^/fio (static, from Debian source) /' >>"$DEV/MANIFEST"
  say ".device/debs: $(ls "$DEV"/debs/*.deb | wc -l) packages, $(mib "$(du -sb "$DEV/debs" | cut -f1)")"
  cmd_size
}

# ------------------------------------------------------------------------------ run

now() { date +%s; }
left() { echo $((DEADLINE - $(now))); }

# step NAME LOG CMD...: runs CMD with its output in LOG, records name, rc and seconds.
step() {
  local name=$1 log=$2 t0 rc
  shift 2
  t0=$(now)
  say "$name ..."
  "$@" >>"$log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" $(($(now) - t0)) >>"$WORK/steps.tsv"
  say "$name: rc $rc, $(($(now) - t0)) s"
  return $rc
}

# tstep NAME LOG CAP CMD...: step with CMD (a program, not a function) stopped after CAP
# seconds or when the budget is 30 s from its end, whichever comes first.
tstep() {
  local name=$1 log=$2 cap=$3 secs
  shift 3
  secs=$(($(left) - 30))
  ((secs > cap)) && secs=$cap
  ((secs > 0)) || { skip "$name" "no time left"; return 1; }
  step "$name" "$log" timeout --kill-after=10 "$secs" "$@"
}

# skip NAME WHY: records a step that did not run.
skip() {
  printf '%s\tskipped\t0\t%s\n' "$1" "$2" >>"$WORK/steps.tsv"
  say "$1: skipped ($2)"
}

pick_python() {
  local c
  for c in ${STRATA_DEVICE_PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$c" >/dev/null && "$c" -c 'import torch' 2>/dev/null; then
      command -v "$c"
      return
    fi
  done
  command -v python3 || echo /usr/bin/python3
}

facts() {
  "$PY" - "$WORK/facts.json" "$DATA" <<'EOF'
import json, os, platform, shutil, subprocess, sys
def sh(*cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (r.stdout or r.stderr).strip()
    except Exception as e:  # missing tool
        return f"unavailable: {e}"
f = {}
f["nvidia_smi"] = sh("nvidia-smi", "--query-gpu=name,memory.total,driver_version,pci.bus_id",
                     "--format=csv,noheader")
f["nproc"] = os.cpu_count()
f["free"] = sh("free", "-b")
data = sys.argv[2]
os.makedirs(data, exist_ok=True)
f["df_data"] = sh("df", "-B1", "-T", data)
f["df_tmp"] = sh("df", "-B1", "-T", "/tmp")
f["kernel"] = platform.release()
f["os"] = sh("sh", "-c", ". /etc/os-release && echo $PRETTY_NAME")
f["glibc"] = sh("getconf", "GNU_LIBC_VERSION")
f["python"] = sys.executable + " " + sys.version.split()[0]
try:
    import sysconfig
    inc = sysconfig.get_paths()["include"]
    f["python_headers"] = os.path.exists(os.path.join(inc, "Python.h"))
except Exception as e:
    f["python_headers"] = str(e)
try:
    import torch
    f["torch"] = torch.__version__
    f["torch_cuda"] = torch.version.cuda
    f["torch_cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        f["torch_device"] = torch.cuda.get_device_name(0)
except Exception as e:
    f["torch"] = f"unavailable: {e}"
try:
    import transformers
    f["transformers"] = transformers.__version__
except Exception as e:
    f["transformers"] = f"unavailable: {e.__class__.__name__}"
for tool in ("nvcc", "gcc", "g++", "cmake", "ninja", "dpkg", "readelf"):
    p = shutil.which(tool)
    f[tool] = (p + ": " + sh(p, "--version").splitlines()[-1 if tool == "nvcc" else 0]) if p else None
f["io_uring_disabled"] = sh("cat", "/proc/sys/kernel/io_uring_disabled")
json.dump(f, open(sys.argv[1], "w"), indent=1)
for k, v in f.items():
    print(f"{k}: {v}")
EOF
}

# Unpacks every .deb into $PREFIX (dpkg -x; without dpkg: ar + tar through python).
unpack() {
  rm -rf "$PREFIX" && mkdir -p "$PREFIX"
  local f
  for f in "$DEV"/debs/*.deb; do
    if command -v dpkg >/dev/null; then
      dpkg -x "$f" "$PREFIX" || return 1
    else
      "$PY" - "$f" "$PREFIX" <<'EOF' || return 1
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n", "not a .deb"
pos = 8
while pos < len(data):
    name = data[pos:pos + 16].decode().strip().rstrip("/")
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(body)).extractall(sys.argv[2])
    pos += 60 + size + (size & 1)
EOF
    fi
  done
  # The libraries the machine lacks (or all, STRATA_DEVICE_LINK_ALL=1) as links in one
  # folder on LD_LIBRARY_PATH: the build tree's RUNPATH finds strata's direct dependencies,
  # this finds theirs (libgloo -> libhiredis, libibverbs, ...).
  mkdir -p "$PREFIX/ldpath"
  local so name soname linked=0
  for so in "$PREFIX"/usr/lib/$ARCH/lib*.so.* "$PREFIX"/lib/$ARCH/lib*.so.* "$PREFIX"/usr/lib/lib*.so.*; do
    [[ -e $so ]] || continue
    name=$(basename "$so")
    if command -v readelf >/dev/null; then
      soname=$(readelf -d "$so" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
      [[ -n $soname && $soname == "$name" ]] || continue
    else
      soname=$name  # every versioned name: harmless extra links
    fi
    if [[ ${STRATA_DEVICE_LINK_ALL:-0} == 1 ]] || ! ldconfig -p 2>/dev/null | grep -q "^[[:space:]]$soname "; then
      ln -sf "$so" "$PREFIX/ldpath/$soname"
      linked=$((linked + 1))
    fi
  done
  say "unpacked $(ls "$DEV"/debs/*.deb | wc -l) packages into $PREFIX; $linked libraries on LD_LIBRARY_PATH: $(ls "$PREFIX/ldpath" | paste -sd' ')"
}

# CUDA toolkit root and NCCL (the toolkit's, the system's, or pip's nvidia-nccl-cu*).
find_cuda() {
  CUDA_ROOT=${CUDAToolkit_ROOT:-}
  if [[ -z $CUDA_ROOT ]]; then
    if [[ -x /usr/local/cuda/bin/nvcc ]]; then CUDA_ROOT=/usr/local/cuda
    elif command -v nvcc >/dev/null; then CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    fi
  fi
  NCCL_ARGS=()
  local d lib inc
  for d in "$CUDA_ROOT/lib64" "$CUDA_ROOT/lib" /usr/lib/$ARCH; do
    [[ -e $d/libnccl.so || -e $d/libnccl.so.2 ]] && lib=$(ls "$d"/libnccl.so* | head -1) && break
  done
  if [[ -z ${lib:-} || ! -e $CUDA_ROOT/include/nccl.h && ! -e /usr/include/nccl.h ]]; then
    # pip's wheels: nvidia/nccl/{lib,include} (or another folder under nvidia/).
    local found
    found=$("$PY" - 2>/dev/null <<'NCCL_EOF'
import os
import nvidia
lib = inc = None
for base in nvidia.__path__:
    for d, _, files in os.walk(base):
        for f in sorted(files):
            if f.startswith("libnccl.so") and not lib:
                lib = os.path.join(d, f)
            if f == "nccl.h" and not inc:
                inc = d
if lib and inc:
    print(lib, inc)
NCCL_EOF
)
    if [[ -n $found ]]; then
      read -r lib inc <<<"$found"
      NCCL_ARGS=(-DNCCL_LIBRARY="$lib" -DNCCL_INCLUDE_DIR="$inc")
      export LD_LIBRARY_PATH=$(dirname "$lib"):$LD_LIBRARY_PATH
    fi
  fi
  say "CUDA toolkit: ${CUDA_ROOT:-none}; NCCL: ${lib:-none}${inc:+ (headers $inc)}"
}

configure() {
  local L=$PREFIX/usr/lib/$ARCH pyb
  pyb=$("$PY" -m pybind11 --cmakedir 2>/dev/null)
  export PKG_CONFIG_LIBDIR=$L/pkgconfig:$PREFIX/usr/lib/pkgconfig:$PREFIX/usr/share/pkgconfig
  export PKG_CONFIG_PATH=
  export PKG_CONFIG_SYSROOT_DIR=$PREFIX
  # In the environment too, for the CMake projects the tests configure (tests/consumer).
  # (The environment's lists are ':'-separated, the cache's ';'-separated.)
  export CMAKE_PREFIX_PATH=$PREFIX/usr:$L/cmake:$PREFIX/usr/share/cmake
  export CMAKE_LIBRARY_PATH=$L:$PREFIX/usr/lib
  export CMAKE_INCLUDE_PATH=$PREFIX/usr/include
  local link="-Wl,-rpath-link,$L:$PREFIX/usr/lib"
  local args=(-S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
    -DSTRATA_WITH_CUDA=ON -DPKG_CONFIG_EXECUTABLE="$PREFIX/usr/bin/pkgconf"
    -DCMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH//:/;}" -DCMAKE_LIBRARY_PATH="${CMAKE_LIBRARY_PATH//:/;}"
    -DCMAKE_INCLUDE_PATH="$CMAKE_INCLUDE_PATH"
    -DPython3_EXECUTABLE="$PY" -DSTRATA_PYTHON="$PY"
    -DCMAKE_EXE_LINKER_FLAGS="$link" -DCMAKE_SHARED_LINKER_FLAGS="$link"
    -DCMAKE_MODULE_LINKER_FLAGS="$link" -DCMAKE_POLICY_VERSION_MINIMUM=3.5)
  [[ -n $CUDA_ROOT ]] && args+=(-DCUDAToolkit_ROOT="$CUDA_ROOT")
  [[ -n $pyb ]] && args+=(-Dpybind11_DIR="$pyb")
  args+=("${NCCL_ARGS[@]}")
  # shellcheck disable=SC2206
  args+=(${STRATA_DEVICE_CMAKE_ARGS:-})
  rm -rf "$BUILD"
  echo "cmake ${args[*]}"
  cmake "${args[@]}"
}

# Where each dependency was found (CMakeCache), and how many compile commands name the prefix.
check_prefix() {
  local c=$BUILD/CMakeCache.txt
  {
    for v in pkgcfg_lib_URING_uring pkgcfg_lib_HWLOC_hwloc pkgcfg_lib_XXHASH_xxhash \
             pkgcfg_lib_HWY_hwy GLOO_LIBRARY GLOO_INCLUDE_DIR SQLite3_LIBRARY SQLite3_INCLUDE_DIR \
             Boost_DIR Boost_INCLUDE_DIR GTest_DIR benchmark_DIR nlohmann_json_DIR CLI11_DIR \
             PKG_CONFIG_EXECUTABLE NCCL_LIBRARY CUDAToolkit_ROOT pybind11_DIR Python3_EXECUTABLE; do
      printf '%s\t%s\n' "$v" "$(sed -n "s/^$v:[A-Z]*=//p" "$c" | head -1)"
    done
    printf 'STRATA_HAVE_CUDA\t%s\n' "$(sed -n 's/.*strata: CUDA runtime + NCCL: //p' "$OUT/configure.log" | tail -1)"
    printf 'compile_commands_with_prefix_include\t%s\n' \
      "$(ninja -C "$BUILD" -t commands 2>/dev/null | grep -c -- "-I$PREFIX/usr/include\|-isystem $PREFIX/usr/include")"
    printf 'compile_commands\t%s\n' "$(ninja -C "$BUILD" -t commands 2>/dev/null | grep -c -- ' -c ')"
  } >"$WORK/prefix.tsv"
  cat "$WORK/prefix.tsv"
}

ctest_run() {  # ctest_run NAME JUNIT SECONDS ARGS...
  local name=$1 junit=$2 secs=$3
  shift 3
  (cd "$BUILD" && timeout --signal=TERM --kill-after=15 "$secs" \
    ctest --output-on-failure --no-tests=ignore --output-junit "$junit" "$@")
}

benches() {
  local size=${STRATA_DEVICE_BENCH_SIZE:-1GiB} fsize
  fsize=${size%iB}
  mkdir -p "$DATA"
  tstep bench_device "$OUT/bench.log" 120 sh -c "'$BUILD/strata' bench device --path '$DATA' --size $size --rounds 3 --json > '$WORK/bench_device.json'"
  cat "$WORK/bench_device.json" >>"$OUT/bench.log"
  # The disk's own limit: fio and strata's engine, sequential O_DIRECT reads of the same shape.
  local eng
  for eng in io_uring psync; do
    if tstep "fio_read_$eng" "$OUT/bench.log" 90 "$DEV/bin/fio" --name=seqread --filename="$DATA/fio.dat" \
        --size="$fsize" --rw=read --bs=1M --iodepth=32 --ioengine=$eng --direct=1 \
        --output-format=json --output="$WORK/fio_read.json"; then
      echo "$eng" >"$WORK/fio_engine"
      break
    fi
  done
  rm -f "$DATA/fio.dat"
  tstep bench_io_write "$OUT/bench.log" 60 "$BUILD/strata" bench io --path "$DATA" --size "$size" \
    --block-size 1MiB --queue-depth 32 --op write --keep
  tstep bench_io_read "$OUT/bench.log" 60 sh -c "'$BUILD/strata' bench io --path '$DATA' --size $size --block-size 1MiB --queue-depth 32 --op read --json > '$WORK/bench_io.json'"
  cat "$WORK/bench_io.json" >>"$OUT/bench.log"
  rm -f "$DATA"/strata-bench-io*
  tstep device_tier "$OUT/bench.log" 120 env PYTHONPATH="$BUILD/python" "$PY" \
    "$ROOT/bench/gpu/device_tier.py" --dir "$DATA/tier" --size "$size" --json "$WORK/device_tier.json"
}

summary() {
  "$PY" - "$WORK" "$OUT" "$PREFIX" "$BUILD" <<'EOF'
import glob, json, os, sys
import xml.etree.ElementTree as ET
work, out, prefix, build = sys.argv[1:5]
def load(name):
    try:
        return json.load(open(os.path.join(work, name)))
    except Exception:
        return None
s = {"facts": load("facts.json") or {}, "steps": {}}
for line in open(os.path.join(work, "steps.tsv")):
    name, rc, secs, *why = line.rstrip("\n").split("\t")
    s["steps"][name] = {"rc": rc if rc == "skipped" else int(rc), "seconds": int(secs)}
    if why:
        s["steps"][name]["why"] = why[0]
st = s["steps"]
s["build_ok"] = st.get("build", {}).get("rc") == 0
deps = {}
if os.path.exists(os.path.join(work, "prefix.tsv")):
    for line in open(os.path.join(work, "prefix.tsv")):
        k, _, v = line.rstrip("\n").partition("\t")
        deps[k] = v
s["configure"] = deps
dep_keys = [k for k in deps if k.startswith(("pkgcfg_lib", "GLOO", "SQLite3", "Boost", "GTest",
                                              "benchmark", "nlohmann", "CLI11", "PKG_CONFIG"))]
s["deps_outside_prefix"] = [k for k in dep_keys if deps[k] and not deps[k].startswith(prefix)]
def junit(name):
    p = os.path.join(work, name)
    if not os.path.exists(p):
        return None
    try:
        r = ET.parse(p).getroot()
    except ET.ParseError as e:
        return {"error": str(e)}
    res = {"passed": 0, "failed": 0, "skipped": 0, "failed_names": [], "skipped_names": []}
    for tc in r.iter("testcase"):
        status = tc.get("status", "")
        if tc.find("failure") is not None or tc.find("error") is not None or status == "fail":
            res["failed"] += 1
            res["failed_names"].append(tc.get("name"))
        elif tc.find("skipped") is not None or status in ("notrun", "disabled"):
            res["skipped"] += 1
            res["skipped_names"].append(tc.get("name"))
            if tc.find("skipped") is not None and "first_skip" not in res:
                el = tc.find("skipped")  # pytest: the reason in the text, ctest: none
                res["first_skip"] = (el.text or el.get("message") or "").strip()[:300]
        else:
            res["passed"] += 1
    return res
s["tests_gpu"] = junit("ctest-gpu.xml")
s["tests_rest"] = junit("ctest-rest.xml")
s["torch_optim_db"] = junit("torch_optim_db.xml")  # pytest's JUnit XML (test_torch_optim_db.py)
b = {}
bd = load("bench_device.json")
fio = load("fio_read.json")
bio = load("bench_io.json")
if bd:
    b["bench_device"] = bd
if fio:
    job = fio["jobs"][0]["read"]
    b["fio_read_gbps"] = job["bw_bytes"] / 1e9
    try:
        b["fio_engine"] = open(os.path.join(work, "fio_engine")).read().strip()
    except OSError:
        pass
if bio:
    b["strata_bench_io_read"] = bio
if bd and "nvme_to_device_gbps" in bd:
    lim = [x for x in (b.get("fio_read_gbps"), bd.get("h2d_pinned_gbps")) if x]
    if lim:
        b["nvme_to_device_limit_gbps"] = min(lim)
        b["nvme_to_device_vs_fio_h2d_limit"] = bd["nvme_to_device_gbps"] / min(lim)
dt = load("device_tier.json")
if dt:
    b["device_tier"] = dt
s["benchmarks"] = b
s["hf_gpu_train"] = load("hf_gpu_train.json")
s["hf_interop"] = load("hf_interop.json")
json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=1)

# The table, last.
def fmt(v):
    return f"{v:.2f}" if isinstance(v, float) else str(v)
rows = [("machine", f"{s['facts'].get('nvidia_smi', '?')} | {s['facts'].get('nproc')} cores | "
                    f"torch {s['facts'].get('torch')}")]
for name, v in st.items():
    rows.append((f"step {name}", f"rc {v['rc']}, {v['seconds']} s" + (f" ({v['why']})" if "why" in v else "")))
for k in ("tests_gpu", "tests_rest", "torch_optim_db"):
    t = s[k]
    if t and "passed" in t:
        rows.append((k, f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped"
                        + (f"; failed: {' '.join(t['failed_names'][:6])}" if t["failed"] else "")
                        + (f"; first skip: {t['first_skip']}" if t["skipped"] and t.get("first_skip") else "")))
if s["deps_outside_prefix"]:
    rows.append(("deps outside prefix", " ".join(s["deps_outside_prefix"])))
if bd:
    rows.append(("pinned h2d / d2h GB/s", f"{fmt(bd.get('h2d_pinned_gbps'))} / {fmt(bd.get('d2h_pinned_gbps'))}"))
    if "nvme_to_device_gbps" in bd:
        rows.append(("nvme->HBM GB/s (store)", fmt(bd["nvme_to_device_gbps"])))
if "fio_read_gbps" in b:
    rows.append((f"fio read GB/s ({b.get('fio_engine')})", fmt(b["fio_read_gbps"])))
if "nvme_to_device_vs_fio_h2d_limit" in b:
    rows.append(("nvme->HBM / min(fio, h2d)", fmt(b["nvme_to_device_vs_fio_h2d_limit"])))
if dt:
    rows.append(("device tier GB/s", " ".join(f"{k}={fmt(v)}" for k, v in dt.items()
                                              if k.endswith("gbps"))))
hf = s["hf_gpu_train"]
if hf:
    if hf.get("skipped"):
        rows.append(("hf_gpu_train", "skipped: " + hf["skipped"]))
    else:
        rows.append(("hf_gpu_train", f"loss strata {hf['final_loss_strata']:.5f} torch "
                     f"{hf['final_loss_torch']:.5f} (rel {hf['loss_rel_diff']:.1e}); samples/s "
                     f"strata {hf['samples_per_s_strata']:.1f} torch {hf['samples_per_s_torch']:.1f}"))
hi = s["hf_interop"]
if hi:
    if hi.get("skipped"):
        rows.append(("hf_interop", "skipped: " + hi["skipped"]))
    else:
        rows.append(("hf_interop", f"{'OK' if hi.get('ok') else 'MISMATCH'}: {hi.get('tensors')} "
                     f"tensors, import {hi.get('import_seconds', 0):.2f} s, export "
                     f"{hi.get('export_seconds', 0):.2f} s (safetensors.torch.load_file, "
                     "from_pretrained)"))
w = max(len(r[0]) for r in rows)
print("\n==== strata device check: summary (" + os.path.join(out, "summary.json") + ")")
for k, v in rows:
    print(f"{k:<{w}}  {v}")
EOF
}

cmd_run() {
  local t_start
  t_start=$(now)
  DEADLINE=$((t_start + ${STRATA_DEVICE_BUDGET_S:-540}))
  OUT=${OUT:-/tmp/strata-device-out}
  PREFIX=${STRATA_DEVICE_PREFIX:-/tmp/strata-deps}
  BUILD=${STRATA_DEVICE_BUILD:-/tmp/strata-device-build}
  DATA=${STRATA_DEVICE_DATA:-/var/tmp/strata-device}
  WORK=$BUILD.work
  local jobs=${STRATA_DEVICE_JOBS:-$(nproc)}
  [[ -d $DEV/debs ]] || die "no $DEV/debs: run 'scripts/device-check.sh prepare' first (and carry .device)"
  mkdir -p "$OUT"
  rm -f "$OUT"/{run,configure,build,ctest-gpu,ctest-rest,bench,hf}.log "$OUT/summary.json"
  rm -rf "$WORK" && mkdir -p "$WORK" && : >"$WORK/steps.tsv"
  exec > >(tee -a "$OUT/run.log") 2>&1
  PY=$(pick_python)
  say "python: $PY; out: $OUT; prefix: $PREFIX; build: $BUILD; data: $DATA; budget $(left) s"
  export PATH=$DEV/bin:$PATH
  export LD_LIBRARY_PATH=$PREFIX/ldpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  step facts "$OUT/run.log" facts
  local have_gpu=0
  nvidia-smi -L >/dev/null 2>&1 && "$PY" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && have_gpu=1
  say "GPU: $([[ $have_gpu == 1 ]] && echo yes || echo 'none: the GPU steps skip')"
  trap 'summary' EXIT
  step unpack "$OUT/run.log" unpack || exit 1
  find_cuda
  step configure "$OUT/configure.log" configure || exit 1
  step build "$OUT/build.log" nice -n "${STRATA_DEVICE_NICE:-0}" ninja -C "$BUILD" -j"$jobs" || exit 1
  check_prefix >>"$OUT/configure.log"
  step ctest_gpu "$OUT/ctest-gpu.log" ctest_run gpu "$WORK/ctest-gpu.xml" $(($(left) - 60)) -L gpu
  if [[ $have_gpu == 1 ]]; then
    benches
  else
    skip benches "no GPU"
  fi
  tstep hf_gpu_train "$OUT/hf.log" 180 env PYTHONPATH="$BUILD/python" PYTHONUNBUFFERED=1 "$PY" \
    "$ROOT/examples/hf_gpu_train.py" --dir "$DATA/hf" --json "$WORK/hf_gpu_train.json"
  tstep hf_interop "$OUT/hf.log" 150 env PYTHONPATH="$BUILD/python" PYTHONUNBUFFERED=1 "$PY" \
    "$ROOT/tests/bindings/torch_checkpoints/hf_interop_check.py" --dir "$DATA/hf_interop" \
    --json "$WORK/hf_interop.json"
  # torch.optim classes through OffloadOptimizer against torch's optim_db (skips on a torch
  # without it); the nvme tier under $DATA; left out of ctest_rest below (run once).
  tstep torch_optim_db "$OUT/run.log" 180 env PYTHONPATH="$BUILD/python" STRATA_CLI="$BUILD/strata" \
    OMP_NUM_THREADS=2 "$PY" -m pytest -q -rfEs --tb=short -p no:cacheprovider \
    --basetemp "$DATA/torch_optim_db" --junitxml "$WORK/torch_optim_db.xml" \
    "$ROOT/tests/bindings/torch_optim/test_torch_optim_db.py"
  if [[ ${STRATA_DEVICE_REST:-1} == 1 && $(left) -gt 60 ]]; then
    step ctest_rest "$OUT/ctest-rest.log" ctest_run rest "$WORK/ctest-rest.xml" $(($(left) - 20)) \
      -LE gpu -E 'bindings\.torch_optim\.test_torch_optim_db$' -j"$jobs" --timeout 300
  else
    skip ctest_rest "STRATA_DEVICE_REST=${STRATA_DEVICE_REST:-1}, $(left) s left"
  fi
  say "done in $(($(now) - t_start)) s"
}

case "${1:-}" in
  prepare) cmd_prepare ;;
  run) cmd_run ;;
  size) cmd_size ;;
  *) sed -n '2,6p' "$0"; exit 2 ;;
esac
