"""A fleet: many pods run as one, with the software stack managed centrally (`deskpod.fleet.stacks`)."""
