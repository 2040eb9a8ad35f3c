#!/usr/bin/python3
"""Writes two_socket_gpu_nvme.xml, the hwloc 2 XML topology used by test_topology.cpp.

2 packages, each with 1 NUMA node (16 GiB) and 4 cores x 1 PU:
  Package 0 / NUMA node 0 (PUs 0-3): NVMe nvme0n1 (0000:01:00.0), GPU cuda1 (0000:02:00.0)
  Package 1 / NUMA node 1 (PUs 4-7): GPU cuda0 (0000:41:00.0), NVMe nvme1n1 (0000:c1:00.0)
  Machine (local to both nodes):    virtio disk vdb (0000:00:04.0)
hwloc's minimal XML parser accepts no comments, hence this generator.
Check with: lstopo-no-graphics -i two_socket_gpu_nvme.xml
"""
import os

gp = [100]


def g():
    gp[0] += 1
    return gp[0]


def hexset(bits):
    v = 0
    for b in bits:
        v |= 1 << b
    return "0x%08x" % v


lines = []


def obj(ind, s):
    lines.append("  " * ind + s)


def pcidev(ind, busid, cls, vendor, device, osname, ostype, subtype, infos):
    obj(ind, f'<object type="PCIDev" gp_index="{g()}" pci_busid="{busid}" '
             f'pci_type="{cls} [{vendor}:{device}] [{vendor}:0000] a1" pci_link_speed="15.753846">')
    st = f' subtype="{subtype}"' if subtype else ""
    obj(ind + 1, f'<object type="OSDev" gp_index="{g()}" name="{osname}"{st} osdev_type="{ostype}">')
    for k, v in infos:
        obj(ind + 2, f'<info name="{k}" value="{v}"/>')
    obj(ind + 1, "</object>")
    obj(ind, "</object>")


def bridge(ind, bus, dev):
    obj(ind, f'<object type="Bridge" gp_index="{g()}" bridge_type="0-1" depth="0" '
             f'bridge_pci="0000:[{bus}-{bus}]">')
    pcidev(ind + 1, *dev)
    obj(ind, "</object>")


gpu_infos = [("Backend", "CUDA"), ("GPUModel", "NVIDIA H200")]
io = {
    0: [("01", ("0000:01:00.0", "0108", "144d", "a80a", "nvme0n1", "0", None, [("SectorSize", "512")])),
        ("02", ("0000:02:00.0", "0302", "10de", "2335", "cuda1", "5", "CUDA", gpu_infos))],
    1: [("41", ("0000:41:00.0", "0302", "10de", "2335", "cuda0", "5", "CUDA", gpu_infos)),
        ("c1", ("0000:c1:00.0", "0108", "144d", "a80a", "nvme1n1", "0", None, [("SectorSize", "4096")]))],
}
allc, alln = hexset(range(8)), hexset([0, 1])
lines.append('<?xml version="1.0" encoding="UTF-8"?>')
lines.append('<!DOCTYPE topology SYSTEM "hwloc2.dtd">')
lines.append('<topology version="2.0">')
obj(1, f'<object type="Machine" os_index="0" cpuset="{allc}" complete_cpuset="{allc}" '
       f'allowed_cpuset="{allc}" nodeset="{alln}" complete_nodeset="{alln}" '
       f'allowed_nodeset="{alln}" gp_index="1">')
for p in (0, 1):
    cpus = range(4 * p, 4 * p + 4)
    cs, ns = hexset(cpus), hexset([p])
    sets = f'cpuset="{cs}" complete_cpuset="{cs}" nodeset="{ns}" complete_nodeset="{ns}"'
    obj(2, f'<object type="Package" os_index="{p}" {sets} gp_index="{g()}">')
    obj(3, f'<object type="NUMANode" os_index="{p}" {sets} gp_index="{g()}" local_memory="17179869184">')
    obj(4, '<page_type size="4096" count="4194304"/>')
    obj(3, "</object>")
    for c in cpus:
        c1 = hexset([c])
        one = f'cpuset="{c1}" complete_cpuset="{c1}" nodeset="{ns}" complete_nodeset="{ns}"'
        obj(3, f'<object type="Core" os_index="{c}" {one} gp_index="{g()}">')
        obj(4, f'<object type="PU" os_index="{c}" {one} gp_index="{g()}"/>')
        obj(3, "</object>")
    for bus, dev in io[p]:
        bridge(3, bus, dev)
    obj(2, "</object>")
bridge(2, "00", ("0000:00:04.0", "0180", "1af4", "1042", "vdb", "0", None, [("SectorSize", "512")]))
obj(1, "</object>")
lines.append("</topology>")
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "two_socket_gpu_nvme.xml")
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
