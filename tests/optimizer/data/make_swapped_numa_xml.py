#!/usr/bin/python3
"""Writes swapped_numa_nodes.xml, the hwloc 2 XML topology of test_kernel_pool.cpp: two
packages of one NUMA node and two single-PU cores each, whose NUMA nodes' kernel numbers
(OS indices) are the reverse of hwloc's logical order:
  Package 0 (PUs 0-1): NUMA node os_index 1 (hwloc logical index 0)
  Package 1 (PUs 2-3): NUMA node os_index 0 (hwloc logical index 1)
hwloc's minimal XML parser accepts no comments, hence this generator.
Check with: lstopo-no-graphics -i swapped_numa_nodes.xml -p (physical) and -l (logical).
"""
import os


def hexset(bits):
    return "0x%08x" % sum(1 << b for b in bits)


gp = [1]


def g():
    gp[0] += 1
    return gp[0]


lines = ['<?xml version="1.0" encoding="UTF-8"?>', '<!DOCTYPE topology SYSTEM "hwloc2.dtd">',
         '<topology version="2.0">']
allc, alln = hexset(range(4)), hexset(range(2))
lines.append(f'  <object type="Machine" os_index="0" cpuset="{allc}" complete_cpuset="{allc}" '
             f'allowed_cpuset="{allc}" nodeset="{alln}" complete_nodeset="{alln}" '
             f'allowed_nodeset="{alln}" gp_index="1">')
for pkg, node in ((0, 1), (1, 0)):
    cpus = range(2 * pkg, 2 * pkg + 2)
    sets = (f'cpuset="{hexset(cpus)}" complete_cpuset="{hexset(cpus)}" '
            f'nodeset="{hexset([node])}" complete_nodeset="{hexset([node])}"')
    lines.append(f'    <object type="Package" os_index="{pkg}" {sets} gp_index="{g()}">')
    lines.append(f'      <object type="NUMANode" os_index="{node}" {sets} gp_index="{g()}" '
                 'local_memory="8589934592">')
    lines.append('        <page_type size="4096" count="2097152"/>')
    lines.append('      </object>')
    for c in cpus:
        one = (f'cpuset="{hexset([c])}" complete_cpuset="{hexset([c])}" '
               f'nodeset="{hexset([node])}" complete_nodeset="{hexset([node])}"')
        lines.append(f'      <object type="Core" os_index="{c}" {one} gp_index="{g()}">')
        lines.append(f'        <object type="PU" os_index="{c}" {one} gp_index="{g()}"/>')
        lines.append('      </object>')
    lines.append('    </object>')
lines += ['  </object>', '</topology>']
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "swapped_numa_nodes.xml"), "w") as f:
    f.write("\n".join(lines) + "\n")
