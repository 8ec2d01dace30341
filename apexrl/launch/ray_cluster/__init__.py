"""``apexrl ray``: a whole run placed on a Ray cluster, each role its own process as everywhere.

Ray places and supervises the roles; it does not carry their data, which goes over apexrl's own
ZeroMQ wire as on one machine. Each role is a small named Ray actor (``RoleRunner``) that runs the
role's own command line, ``apexrl <role> --config <run dir>/config.yaml --keys <bundle>``, as a
child process in its own process group on the node where Ray put it:

- ``plan``: the command's flags and the plan they ask for (placement groups, their bundles, each
  role's resources and command line), checked before anything starts and printed by
  ``--dry-run``; pure, it imports no Ray;
- ``runner``: ``RoleRunner``, the Ray actor that holds one role's process on its node: starts it,
  says whether it lives, signals its process group, copies its log lines to its own output (Ray
  forwards them to the driver prefixed with the role's name and its node's address);
- ``children``: the driver's side of a runner, the ``Child`` that the local launcher's supervisor
  watches: restarts, back-off, the end of the run and the stop are the local launcher's own;
- ``driver``: ``main``: connects to the cluster, places the groups, binds the servers on the head
  node's address, writes the run directory and supervises until the run ends.
"""
