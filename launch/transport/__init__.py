"""Everything that crosses the network to nodes: SSH connections and fan-out, rsync sync, the relay, cluster keys."""
