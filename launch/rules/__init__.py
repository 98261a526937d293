"""When to stop: the metrics stream parser, stop rules with an injected clock, prices. Pure."""
