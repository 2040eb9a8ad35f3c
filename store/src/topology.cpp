// strata::store — hwloc topology (see topology.hpp).
#include "strata/store/topology.hpp"

#include <fcntl.h>
#include <hwloc.h>
#include <liburing.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "strata/store/gpu.hpp"

// Debian 12's headers may predate STATX_DIOALIGN (Linux 6.1). The kernel fills
// stx_dio_mem_align / stx_dio_offset_align (struct statx offsets 0x98 / 0x9c) when asked.
#ifndef STATX_DIOALIGN
#define STATX_DIOALIGN 0x00002000U
#define STRATA_STATX_NO_DIOALIGN_FIELDS 1
#endif

namespace strata {

namespace fs = std::filesystem;

namespace {

std::vector<int> bitmap_to_vector(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (set == nullptr || hwloc_bitmap_iszero(set)) return out;
  if (hwloc_bitmap_weight(set) < 0) return out;  // infinite set
  int i = hwloc_bitmap_first(set);
  while (i != -1) {
    out.push_back(i);
    i = hwloc_bitmap_next(set, i);
  }
  return out;
}

struct Bitmap {
  hwloc_bitmap_t b = hwloc_bitmap_alloc();
  Bitmap() = default;
  explicit Bitmap(const std::vector<int>& v) {
    for (int i : v) hwloc_bitmap_set(b, static_cast<unsigned>(i));
  }
  ~Bitmap() { hwloc_bitmap_free(b); }
  Bitmap(const Bitmap&) = delete;
  Bitmap& operator=(const Bitmap&) = delete;
};

std::string format_bus_id(unsigned domain, unsigned bus, unsigned dev, unsigned func) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%01x", domain, bus, dev, func);
  return buf;
}

// Accepts "dddd:bb:dd.f", "dddddddd:bb:dd.f" (CUDA) and "bb:dd.f" (domain 0).
std::optional<std::string> normalize_bus_id(std::string_view id) {
  std::string s(id);
  unsigned domain = 0, bus = 0, dev = 0, func = 0;
  char tail = 0;
  int colons = static_cast<int>(std::count(s.begin(), s.end(), ':'));
  if (colons == 2) {
    if (std::sscanf(s.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &dev, &func, &tail) != 4) {
      return std::nullopt;
    }
  } else if (colons == 1) {
    if (std::sscanf(s.c_str(), "%x:%x.%x%c", &bus, &dev, &func, &tail) != 3) return std::nullopt;
  } else {
    return std::nullopt;
  }
  if (domain > 0xffff || bus > 0xff || dev > 0x1f || func > 0x7) return std::nullopt;
  return format_bus_id(domain, bus, dev, func);
}

bool looks_like_bus_id(const std::string& s) {
  unsigned a, b, c, d;
  char tail;
  return s.size() == 12 && std::sscanf(s.c_str(), "%4x:%2x:%2x.%1x%c", &a, &b, &c, &d, &tail) == 4;
}

std::optional<std::string> read_first_line(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  return line;
}

std::optional<long> read_long(const fs::path& p) {
  auto line = read_first_line(p);
  if (!line || line->empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(line->c_str(), &end, 10);
  if (errno != 0 || end == line->c_str()) return std::nullopt;
  return v;
}

bool is_subset(const std::vector<int>& small, const std::vector<int>& big) {
  return std::includes(big.begin(), big.end(), small.begin(), small.end());
}

}  // namespace

std::string format_cpulist(const std::vector<int>& cpus_in) {
  std::vector<int> cpus = cpus_in;
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

Result<std::vector<int>> parse_cpulist(std::string_view text) {
  std::vector<int> out;
  std::string s(text);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.empty()) return out;
  size_t pos = 0;
  auto bad = [&] { return invalid_argument("malformed CPU list '" + std::string(text) + "'"); };
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int a = 0, b = 0;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%d-%d%c", &a, &b, &tail) == 2) {
    } else if (std::sscanf(item.c_str(), "%d%c", &a, &tail) == 1) {
      b = a;
    } else {
      return bad();
    }
    if (a < 0 || b < a) return bad();
    for (int c = a; c <= b; ++c) out.push_back(c);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

uint32_t PathInfo::dio_alignment() const {
  if (dio_from_statx && dio_offset_align != 0) return dio_offset_align;
  if (logical_block_size != 0) return logical_block_size;
  return 4096;
}

struct Topology::Impl {
  hwloc_topology_t topo = nullptr;
  TopologySource source = TopologySource::kSystem;
  bool this_system = false;
  int packages = 0, cores = 0, pus = 0;
  std::vector<NumaNodeInfo> nodes;
  std::vector<PciDeviceInfo> pci;
  std::vector<BlockDeviceInfo> blocks;
  std::vector<GpuInfo> gpus;  // computed at load

  ~Impl() {
    if (topo != nullptr) hwloc_topology_destroy(topo);
  }
};

Topology::Topology(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Topology::~Topology() = default;

namespace {

Result<std::unique_ptr<Topology::Impl>> init_impl() {
  auto impl = std::make_unique<Topology::Impl>();
  if (hwloc_topology_init(&impl->topo) != 0) {
    int e = errno;
    impl->topo = nullptr;
    return Status(StatusCode::kInternal, "hwloc_topology_init failed", e);
  }
  // PCI devices, bridges leading to them, and OS devices (block, GPU, NIC) that matter.
  hwloc_topology_set_io_types_filter(impl->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  return impl;
}

Status load_impl(Topology::Impl& impl, const std::string& what) {
  if (hwloc_topology_load(impl.topo) != 0) {
    int e = errno;
    return Status(StatusCode::kInvalidArgument, "hwloc_topology_load(" + what + ") failed", e);
  }
  impl.this_system = hwloc_topology_is_thissystem(impl.topo) != 0;
  return Status::OK();
}

}  // namespace

int Topology::nearest_numa_node(const std::vector<int>& cpus_in, std::vector<int>* local) const {
  std::vector<int> cpus = cpus_in;
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  if (local) local->clear();
  if (cpus.empty()) {
    if (local) {
      for (const auto& n : impl_->nodes) local->push_back(n.os_index);
    }
    return impl_->nodes.size() == 1 ? impl_->nodes[0].os_index : -1;
  }
  // Nodes whose CPUs include all of `cpus` (hwloc: LARGER_LOCALITY); smallest wins.
  const NumaNodeInfo* best = nullptr;
  std::vector<int> containing;
  for (const auto& n : impl_->nodes) {
    if (!n.cpus.empty() && is_subset(cpus, n.cpus)) {
      containing.push_back(n.os_index);
      if (best == nullptr || n.cpus.size() < best->cpus.size()) best = &n;
    }
  }
  if (best != nullptr) {
    if (local) *local = containing;
    return best->os_index;
  }
  // Nodes lying inside `cpus` (hwloc: SMALLER_LOCALITY): unique one wins.
  std::vector<int> inside;
  for (const auto& n : impl_->nodes) {
    if (!n.cpus.empty() && is_subset(n.cpus, cpus)) inside.push_back(n.os_index);
  }
  if (local) *local = inside;
  return inside.size() == 1 ? inside[0] : -1;
}

Result<std::shared_ptr<const Topology>> Topology::finish(std::unique_ptr<Impl> impl) {
  hwloc_topology_t t = impl->topo;
  impl->packages = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE);
  impl->cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
  impl->pus = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);

  for (hwloc_obj_t o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nullptr); o != nullptr;
       o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, o)) {
    NumaNodeInfo n;
    n.os_index = static_cast<int>(o->os_index);
    n.cpus = bitmap_to_vector(o->cpuset);
    n.cpulist = format_cpulist(n.cpus);
    n.memory_bytes = o->attr != nullptr ? o->attr->numanode.local_memory : 0;
    // A core belongs to the node when all its PUs do.
    int ncores = 0;
    for (hwloc_obj_t c = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_CORE, nullptr); c != nullptr;
         c = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_CORE, c)) {
      if (!hwloc_bitmap_iszero(c->cpuset) && hwloc_bitmap_isincluded(c->cpuset, o->cpuset)) {
        ++ncores;
      }
    }
    n.cores = ncores;
    impl->nodes.push_back(std::move(n));
  }
  std::sort(impl->nodes.begin(), impl->nodes.end(),
            [](const NumaNodeInfo& a, const NumaNodeInfo& b) { return a.os_index < b.os_index; });

  std::shared_ptr<Topology> topo(new Topology(std::move(impl)));
  Impl& im = *topo->impl_;

  auto locality = [&](hwloc_obj_t o) {
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, o);
    return anc != nullptr ? bitmap_to_vector(anc->cpuset) : std::vector<int>{};
  };

  for (hwloc_obj_t o = hwloc_get_next_pcidev(t, nullptr); o != nullptr;
       o = hwloc_get_next_pcidev(t, o)) {
    PciDeviceInfo d;
    const auto& a = o->attr->pcidev;
    d.bus_id = format_bus_id(a.domain, a.bus, a.dev, a.func);
    d.vendor_id = a.vendor_id;
    d.device_id = a.device_id;
    d.class_id = a.class_id;
    for (hwloc_obj_t c = o->io_first_child; c != nullptr; c = c->next_sibling) {
      if (c->type == HWLOC_OBJ_OS_DEVICE && c->name != nullptr) d.os_devices.emplace_back(c->name);
    }
    d.numa_node = topo->nearest_numa_node(locality(o), &d.local_numa_nodes);
    im.pci.push_back(std::move(d));
  }
  std::sort(im.pci.begin(), im.pci.end(),
            [](const PciDeviceInfo& a, const PciDeviceInfo& b) { return a.bus_id < b.bus_id; });

  for (hwloc_obj_t o = hwloc_get_next_osdev(t, nullptr); o != nullptr;
       o = hwloc_get_next_osdev(t, o)) {
    if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_BLOCK || o->name == nullptr) continue;
    BlockDeviceInfo b;
    b.name = o->name;
    for (hwloc_obj_t p = o->parent; p != nullptr; p = p->parent) {
      if (p->type == HWLOC_OBJ_PCI_DEVICE) {
        const auto& a = p->attr->pcidev;
        b.pci_bus_id = format_bus_id(a.domain, a.bus, a.dev, a.func);
        break;
      }
      if (p->type != HWLOC_OBJ_OS_DEVICE) break;
    }
    b.numa_node = topo->nearest_numa_node(locality(o), &b.local_numa_nodes);
    im.blocks.push_back(std::move(b));
  }

  // GPUs: CUDA devices on the running machine, else NVIDIA display-class PCI devices.
  if (im.this_system && gpu_count() > 0) {
    for (int i = 0; i < gpu_count(); ++i) {
      GpuInfo g;
      g.cuda_index = i;
      g.name = gpu_name(i).value_or("");
      g.pci_bus_id = gpu_pci_bus_id(i).value_or("");
      g.numa_node = g.pci_bus_id.empty() ? -1 : topo->numa_node_of_pci(g.pci_bus_id).value_or(-1);
      im.gpus.push_back(std::move(g));
    }
  } else {
    for (const auto& d : im.pci) {
      if (d.vendor_id != 0x10de || (d.class_id >> 8) != 0x03) continue;
      GpuInfo g;
      g.pci_bus_id = d.bus_id;
      g.numa_node = d.numa_node;
      for (const auto& os : d.os_devices) {
        int idx = -1;
        char tail = 0;
        if (std::sscanf(os.c_str(), "cuda%d%c", &idx, &tail) == 1) g.cuda_index = idx;
      }
      hwloc_obj_t o = hwloc_get_pcidev_by_busidstring(t, d.bus_id.c_str());
      for (hwloc_obj_t c = o ? o->io_first_child : nullptr; c != nullptr; c = c->next_sibling) {
        if (const char* m = hwloc_obj_get_info_by_name(c, "GPUModel")) g.name = m;
      }
      im.gpus.push_back(std::move(g));
    }
    std::stable_sort(im.gpus.begin(), im.gpus.end(), [](const GpuInfo& a, const GpuInfo& b) {
      return static_cast<unsigned>(a.cuda_index) < static_cast<unsigned>(b.cuda_index);
    });
  }
  return std::shared_ptr<const Topology>(std::move(topo));
}

Result<std::shared_ptr<const Topology>> Topology::load() {
  STRATA_ASSIGN_OR_RETURN(auto impl, init_impl());
  impl->source = TopologySource::kSystem;
  if (auto x = std::getenv("HWLOC_XMLFILE"); x != nullptr && *x != '\0') {
    impl->source = TopologySource::kXml;
  } else if (auto s = std::getenv("HWLOC_SYNTHETIC"); s != nullptr && *s != '\0') {
    impl->source = TopologySource::kSynthetic;
  }
  Status st = load_impl(*impl, "this machine");
  if (!st.ok()) return Status(StatusCode::kInternal, st.message(), st.sys_errno());
  return finish(std::move(impl));
}

Result<std::shared_ptr<const Topology>> Topology::system() {
  static std::mutex mu;
  static std::shared_ptr<const Topology> cached;
  std::lock_guard<std::mutex> lk(mu);
  if (!cached) {
    STRATA_ASSIGN_OR_RETURN(cached, load());
  }
  return cached;
}

Result<std::shared_ptr<const Topology>> Topology::load_synthetic(std::string_view description) {
  STRATA_ASSIGN_OR_RETURN(auto impl, init_impl());
  impl->source = TopologySource::kSynthetic;
  std::string desc(description);
  if (hwloc_topology_set_synthetic(impl->topo, desc.c_str()) != 0) {
    return Status(StatusCode::kInvalidArgument,
                  "hwloc rejected the synthetic topology '" + desc + "'", errno);
  }
  STRATA_RETURN_IF_ERROR(load_impl(*impl, "synthetic '" + desc + "'"));
  return finish(std::move(impl));
}

Result<std::shared_ptr<const Topology>> Topology::load_xml(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found("topology XML file '" + path + "' does not exist");
  STRATA_ASSIGN_OR_RETURN(auto impl, init_impl());
  impl->source = TopologySource::kXml;
  if (hwloc_topology_set_xml(impl->topo, path.c_str()) != 0) {
    return Status(StatusCode::kInvalidArgument,
                  "hwloc cannot read the topology XML file '" + path + "'", errno);
  }
  STRATA_RETURN_IF_ERROR(load_impl(*impl, "XML '" + path + "'"));
  return finish(std::move(impl));
}

TopologySource Topology::source() const { return impl_->source; }
bool Topology::is_this_system() const { return impl_->this_system; }
int Topology::num_packages() const { return impl_->packages; }
int Topology::num_cores() const { return impl_->cores; }
int Topology::num_pus() const { return impl_->pus; }
const std::vector<NumaNodeInfo>& Topology::numa_nodes() const { return impl_->nodes; }
const std::vector<PciDeviceInfo>& Topology::pci_devices() const { return impl_->pci; }
const std::vector<BlockDeviceInfo>& Topology::block_devices() const { return impl_->blocks; }
std::vector<GpuInfo> Topology::gpus() const { return impl_->gpus; }

const NumaNodeInfo* Topology::numa_node(int os_index) const {
  for (const auto& n : impl_->nodes) {
    if (n.os_index == os_index) return &n;
  }
  return nullptr;
}

Result<int> Topology::numa_node_of_pci(std::string_view bus_id) const {
  auto id = normalize_bus_id(bus_id);
  if (!id) return invalid_argument("malformed PCI bus id '" + std::string(bus_id) + "'");
  for (const auto& d : impl_->pci) {
    if (d.bus_id == *id) return d.numa_node;
  }
  if (impl_->this_system) {
    fs::path dir = fs::path("/sys/bus/pci/devices") / *id;
    std::error_code ec;
    if (fs::exists(dir, ec)) {
      if (auto line = read_first_line(dir / "local_cpulist")) {
        auto cpus = parse_cpulist(*line);
        if (cpus.ok() && !cpus->empty()) return nearest_numa_node(*cpus);
      }
      if (auto n = read_long(dir / "numa_node"); n && *n >= 0) return static_cast<int>(*n);
      return impl_->nodes.size() == 1 ? impl_->nodes[0].os_index : -1;
    }
  }
  return not_found("no PCI device " + *id + " in the topology");
}

Result<int> Topology::numa_node_of_block_device(std::string_view name) const {
  for (const auto& b : impl_->blocks) {
    if (b.name == name) return b.numa_node;
  }
  if (impl_->this_system) {
    // A partition: /sys/class/block/<part>/partition exists; its parent is the disk.
    std::error_code ec;
    fs::path p = fs::path("/sys/class/block") / std::string(name);
    if (fs::exists(p / "partition", ec)) {
      fs::path disk = fs::canonical(p, ec).parent_path();
      if (!ec) return numa_node_of_block_device(disk.filename().string());
    }
  }
  return not_found("no block device '" + std::string(name) + "' in the topology");
}

Result<int> Topology::numa_node_of_gpu(int cuda_index) const {
  for (const auto& g : impl_->gpus) {
    if (g.cuda_index == cuda_index && cuda_index >= 0) return g.numa_node;
  }
  return not_found("no GPU with CUDA index " + std::to_string(cuda_index));
}

Result<int> Topology::numa_node_of_cpus(const std::vector<int>& cpus_in) const {
  if (cpus_in.empty()) return invalid_argument("numa_node_of_cpus: empty CPU set");
  std::vector<int> cpus = cpus_in;
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::vector<int> all;
  for (const auto& n : impl_->nodes) all.insert(all.end(), n.cpus.begin(), n.cpus.end());
  std::sort(all.begin(), all.end());
  for (int c : cpus) {
    if (!std::binary_search(all.begin(), all.end(), c)) {
      return invalid_argument("CPU " + std::to_string(c) + " is not in the topology");
    }
  }
  for (const auto& n : impl_->nodes) {
    if (is_subset(cpus, n.cpus)) return n.os_index;
  }
  return not_found("CPUs " + format_cpulist(cpus) + " span several NUMA nodes");
}

Result<PathInfo> Topology::path_info(const std::string& path) const {
  PathInfo info;
  info.path = path;
  struct statx stx {};
  if (::statx(AT_FDCWD, path.c_str(), AT_STATX_SYNC_AS_STAT, STATX_BASIC_STATS | STATX_DIOALIGN,
              &stx) != 0) {
    int e = errno;
    return errno_status(e, "statx('" + path + "')");
  }
  info.dev_major = stx.stx_dev_major;
  info.dev_minor = stx.stx_dev_minor;

  auto take_dio = [&info](const struct statx& s) {
    if ((s.stx_mask & STATX_DIOALIGN) == 0) return;
#ifdef STRATA_STATX_NO_DIOALIGN_FIELDS
    const auto* raw = reinterpret_cast<const unsigned char*>(&s);
    std::memcpy(&info.dio_mem_align, raw + 0x98, 4);
    std::memcpy(&info.dio_offset_align, raw + 0x9c, 4);
#else
    info.dio_mem_align = s.stx_dio_mem_align;
    info.dio_offset_align = s.stx_dio_offset_align;
#endif
    info.dio_from_statx = true;
  };
  if (S_ISREG(stx.stx_mode)) {
    take_dio(stx);
  } else if (S_ISDIR(stx.stx_mode)) {
    // Filesystems report DIO alignment for regular files only: probe an unnamed temp file.
    int fd = ::open(path.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) {
      struct statx fstx {};
      if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &fstx) == 0) take_dio(fstx);
      ::close(fd);
    }
  }

  // st_dev -> /sys/dev/block/MAJ:MIN -> .../block/<disk>[/<partition>]
  std::error_code ec;
  fs::path link = fs::path("/sys/dev/block") /
                  (std::to_string(info.dev_major) + ":" + std::to_string(info.dev_minor));
  fs::path dir = fs::canonical(link, ec);
  if (ec) {
    // Not a block device (tmpfs, overlayfs, NFS, ...).
    info.numa_node = impl_->nodes.size() == 1 ? impl_->nodes[0].os_index : -1;
    return info;
  }
  if (fs::exists(dir / "partition", ec)) {
    info.partition = dir.filename().string();
    dir = dir.parent_path();
  }
  BlockDeviceInfo dev;
  dev.name = dir.filename().string();
  info.logical_block_size =
      static_cast<uint32_t>(read_long(dir / "queue/logical_block_size").value_or(0));
  info.physical_block_size =
      static_cast<uint32_t>(read_long(dir / "queue/physical_block_size").value_or(0));

  // Device-mapper / md: locality of the first underlying disk.
  fs::path locality_dir = dir;
  for (int depth = 0; depth < 8; ++depth) {
    fs::path slaves = locality_dir / "slaves";
    if (!fs::is_directory(slaves, ec)) break;
    fs::directory_iterator it(slaves, ec), end;
    if (ec || it == end) break;
    fs::path next = fs::canonical(it->path(), ec);
    if (ec) break;
    if (fs::exists(next / "partition", ec)) next = next.parent_path();
    locality_dir = next;
  }
  // PCI function: the last "dddd:bb:dd.f" component of the sysfs device path.
  for (const auto& comp : locality_dir) {
    if (looks_like_bus_id(comp.string())) dev.pci_bus_id = comp.string();
  }
  std::string locality_name = locality_dir.filename().string();

  bool found = false;
  for (const auto& b : impl_->blocks) {
    if (b.name == locality_name) {
      dev.numa_node = b.numa_node;
      dev.local_numa_nodes = b.local_numa_nodes;
      if (dev.pci_bus_id.empty()) dev.pci_bus_id = b.pci_bus_id;
      found = true;
      break;
    }
  }
  if (!found && !dev.pci_bus_id.empty()) {
    for (const auto& d : impl_->pci) {
      if (d.bus_id == dev.pci_bus_id) {
        dev.numa_node = d.numa_node;
        dev.local_numa_nodes = d.local_numa_nodes;
        found = true;
        break;
      }
    }
  }
  if (!found && impl_->this_system) {
    // hwloc filtered it out: ask sysfs (numa_node of the device or of a parent).
    for (fs::path p = locality_dir / "device"; !p.empty() && p != p.root_path();
         p = p.parent_path()) {
      if (auto n = read_long(p / "numa_node")) {
        if (*n >= 0) {
          dev.numa_node = static_cast<int>(*n);
          dev.local_numa_nodes = {dev.numa_node};
        }
        break;
      }
      if (p == fs::path("/sys/devices")) break;
    }
  }
  info.numa_node = dev.numa_node;
  if (info.numa_node < 0 && impl_->nodes.size() == 1) info.numa_node = impl_->nodes[0].os_index;
  info.device = std::move(dev);
  return info;
}

namespace {
Status bind_precondition(const Topology& t, const char* what) {
  if (!t.is_this_system()) {
    return failed_precondition(std::string(what) +
                               ": the topology is synthetic or from XML, not this machine");
  }
  return Status::OK();
}
}  // namespace

Status Topology::bind_thread_to_numa_node(int os_index) const {
  STRATA_RETURN_IF_ERROR(bind_precondition(*this, "bind_thread_to_numa_node"));
  const NumaNodeInfo* n = numa_node(os_index);
  if (n == nullptr) return invalid_argument("no NUMA node " + std::to_string(os_index));
  if (n->cpus.empty()) {
    return invalid_argument("NUMA node " + std::to_string(os_index) + " has no CPUs");
  }
  return bind_thread_to_cpus(n->cpus);
}

Status Topology::bind_thread_to_cpus(const std::vector<int>& cpus) const {
  STRATA_RETURN_IF_ERROR(bind_precondition(*this, "bind_thread_to_cpus"));
  if (cpus.empty()) return invalid_argument("bind_thread_to_cpus: empty CPU set");
  Bitmap set(cpus);
  if (!hwloc_bitmap_isincluded(set.b, hwloc_topology_get_topology_cpuset(impl_->topo))) {
    return invalid_argument("CPUs " + format_cpulist(cpus) + " are not all in the topology");
  }
  if (hwloc_set_cpubind(impl_->topo, set.b, HWLOC_CPUBIND_THREAD) != 0) {
    int e = errno;
    return Status(StatusCode::kIoError, "hwloc_set_cpubind(" + format_cpulist(cpus) + ")", e);
  }
  return Status::OK();
}

Result<std::vector<int>> Topology::thread_cpus() const {
  STRATA_RETURN_IF_ERROR(bind_precondition(*this, "thread_cpus"));
  Bitmap set;
  if (hwloc_get_cpubind(impl_->topo, set.b, HWLOC_CPUBIND_THREAD) != 0) {
    int e = errno;
    return Status(StatusCode::kIoError, "hwloc_get_cpubind", e);
  }
  return bitmap_to_vector(set.b);
}

Status Topology::bind_memory_to_numa_node(void* addr, uint64_t nbytes, int os_index,
                                          bool migrate) const {
  STRATA_RETURN_IF_ERROR(bind_precondition(*this, "bind_memory_to_numa_node"));
  if (numa_node(os_index) == nullptr) {
    return invalid_argument("no NUMA node " + std::to_string(os_index));
  }
  Bitmap set;
  hwloc_bitmap_only(set.b, static_cast<unsigned>(os_index));
  int flags = HWLOC_MEMBIND_BYNODESET | (migrate ? HWLOC_MEMBIND_MIGRATE : 0);
  if (hwloc_set_area_membind(impl_->topo, addr, nbytes, set.b, HWLOC_MEMBIND_BIND, flags) != 0) {
    int e = errno;
    return Status(StatusCode::kIoError,
                  "hwloc_set_area_membind(" + std::to_string(nbytes) + " bytes, node " +
                      std::to_string(os_index) + ")",
                  e);
  }
  return Status::OK();
}

Result<std::vector<int>> Topology::memory_location(const void* addr, uint64_t nbytes) const {
  STRATA_RETURN_IF_ERROR(bind_precondition(*this, "memory_location"));
  Bitmap set;
  if (hwloc_get_area_memlocation(impl_->topo, addr, nbytes, set.b, HWLOC_MEMBIND_BYNODESET) != 0) {
    int e = errno;
    return Status(StatusCode::kIoError, "hwloc_get_area_memlocation", e);
  }
  return bitmap_to_vector(set.b);
}

HostFeatures probe_host_features() {
  HostFeatures f;
  {
    struct io_uring ring;
    int rc = io_uring_queue_init(8, &ring, 0);
    if (rc == 0) {
      f.io_uring = true;
      io_uring_queue_exit(&ring);
    } else {
      f.io_uring_errno = -rc;
    }
  }
  if (auto line = read_first_line("/sys/kernel/mm/transparent_hugepage/enabled")) {
    auto lb = line->find('['), rb = line->find(']');
    if (lb != std::string::npos && rb != std::string::npos && rb > lb) {
      f.thp_mode = line->substr(lb + 1, rb - lb - 1);
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    unsigned long long v = 0;
    if (std::sscanf(line.c_str(), "HugePages_Total: %llu", &v) == 1) f.hugetlb_pages_total = v;
    if (std::sscanf(line.c_str(), "HugePages_Free: %llu", &v) == 1) f.hugetlb_pages_free = v;
    if (std::sscanf(line.c_str(), "Hugepagesize: %llu kB", &v) == 1)
      f.hugetlb_page_bytes = v * 1024;
  }
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    f.memlock_limit_bytes = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
  }
  std::ifstream status("/proc/self/status");
  while (std::getline(status, line)) {
    unsigned long long caps = 0;
    if (std::sscanf(line.c_str(), "CapEff: %llx", &caps) == 1) {
      f.cap_ipc_lock = (caps >> 14) & 1;  // CAP_IPC_LOCK = 14
    }
  }
  return f;
}

}  // namespace strata
