"""What ``infra`` (the Pulumi program) and ``launch`` (the launcher) must agree on, in one place.

Both import this package; it imports neither of them (nor Pulumi, Fabric or paramiko), so the
two sides cannot drift and neither depends on the other:

* ``stack_outputs``  the stack-outputs contract: what ``pulumi stack output --json`` prints and
  ``launch``'s inventory reads.
* ``cluster``        how a cluster is named and marked: the project name, the cluster id derived
  from project and stack, and the tag (AWS) / label (GCP) keys every resource carries, which
  ``launch`` lists instances by to confirm a teardown.
* ``lifetime``       a kept-warm fleet's instance lifetime: the ``fleet:warm_until`` key the
  laptop sets and the program reads, and the one form of its time.
"""
