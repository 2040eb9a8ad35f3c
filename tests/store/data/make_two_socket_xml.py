#!/usr/bin/python3
"""Writes two_socket_gpu_nvme.xml and four_socket_gpu_nvme.xml, the hwloc 2 XML topologies
used by test_topology.cpp and test_placement.cpp (layouts: see the write() calls below).
Each package has 1 NUMA node (16 GiB) and 4 cores x 1 PU; a virtio disk vdb
(0000:00:04.0) hangs off the machine (local to every node).
hwloc's minimal XML parser accepts no comments, hence this generator.
Check with: lstopo-no-graphics -i two_socket_gpu_nvme.xml (or four_socket_gpu_nvme.xml)
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


def nvme(busid, name, sector):
    return (busid, "0108", "144d", "a80a", name, "0", None, [("SectorSize", sector)])


def gpu(busid, name):
    return (busid, "0302", "10de", "2335", name, "5", "CUDA", gpu_infos)


def write(filename, npkg, io):
    """npkg packages of one NUMA node (16 GiB) and 4 single-PU cores each; io[p] lists the
    (bus, device) pairs behind bridges on package p; a virtio disk vdb hangs off the machine."""
    gp[0] = 100
    del lines[:]
    ncpu = 4 * npkg
    allc, alln = hexset(range(ncpu)), hexset(range(npkg))
    lines.append('<?xml version="1.0" encoding="UTF-8"?>')
    lines.append('<!DOCTYPE topology SYSTEM "hwloc2.dtd">')
    lines.append('<topology version="2.0">')
    obj(1, f'<object type="Machine" os_index="0" cpuset="{allc}" complete_cpuset="{allc}" '
           f'allowed_cpuset="{allc}" nodeset="{alln}" complete_nodeset="{alln}" '
           f'allowed_nodeset="{alln}" gp_index="1">')
    for p in range(npkg):
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
        for bus, dev in io.get(p, []):
            bridge(3, bus, dev)
        obj(2, "</object>")
    bridge(2, "00", ("0000:00:04.0", "0180", "1af4", "1042", "vdb", "0", None, [("SectorSize", "512")]))
    obj(1, "</object>")
    lines.append("</topology>")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


# 2 sockets:
#   Package 0 / NUMA node 0 (PUs 0-3): NVMe nvme0n1 (0000:01:00.0), GPU cuda1 (0000:02:00.0)
#   Package 1 / NUMA node 1 (PUs 4-7): GPU cuda0 (0000:41:00.0), NVMe nvme1n1 (0000:c1:00.0)
write("two_socket_gpu_nvme.xml", 2, {
    0: [("01", nvme("0000:01:00.0", "nvme0n1", "512")), ("02", gpu("0000:02:00.0", "cuda1"))],
    1: [("41", gpu("0000:41:00.0", "cuda0")), ("c1", nvme("0000:c1:00.0", "nvme1n1", "4096"))],
})
# 4 sockets, GPUs and NVMe drives spread so that no GPU shares a socket with every drive:
#   Package 0 / NUMA node 0 (PUs 0-3):   NVMe nvme0n1 (0000:01:00.0)
#   Package 1 / NUMA node 1 (PUs 4-7):   GPU cuda0 (0000:41:00.0), NVMe nvme1n1 (0000:42:00.0)
#   Package 2 / NUMA node 2 (PUs 8-11):  GPU cuda1 (0000:81:00.0)
#   Package 3 / NUMA node 3 (PUs 12-15): NVMe nvme2n1 (0000:c1:00.0), NVMe nvme3n1
#                                        (0000:c2:00.0), GPU cuda2 (0000:c3:00.0)
write("four_socket_gpu_nvme.xml", 4, {
    0: [("01", nvme("0000:01:00.0", "nvme0n1", "512"))],
    1: [("41", gpu("0000:41:00.0", "cuda0")), ("42", nvme("0000:42:00.0", "nvme1n1", "4096"))],
    2: [("81", gpu("0000:81:00.0", "cuda1"))],
    3: [("c1", nvme("0000:c1:00.0", "nvme2n1", "4096")),
        ("c2", nvme("0000:c2:00.0", "nvme3n1", "4096")),
        ("c3", gpu("0000:c3:00.0", "cuda2"))],
})
