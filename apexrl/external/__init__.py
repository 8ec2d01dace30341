"""External environments: a policy server role (``apexrl external``) that environments apexrl
does not step reach through ``apexrl.PolicyClient``.

- ``config``: the ``external`` section of a run's config (torch-free);
- ``spaces``: observations checked and actions converted between the env's units and the
  network's;
- ``lanes``: external episodes as step blocks of one env each, cut by the run's actor core;
- ``server``: the role's main loop;
- ``client``: ``PolicyClient``, with remote or local inference.
"""
