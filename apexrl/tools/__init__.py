"""The tools a user runs around a run: ``apexrl status`` (``status``), ``apexrl evaluate``
(``evaluate``), ``apexrl plot`` (``plot``) and ``apexrl stop`` (``stop``); ``server_stats`` asks a
server for its ``Stats`` (status, the launcher and serial mode's Stats relay use it)."""
