"""The machine: devices, links, topology, the catalog of reference machines, placement."""
