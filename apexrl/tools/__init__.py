"""The tools a user runs around a run: ``apexrl status`` (``status``), ``apexrl evaluate``
(``evaluate``), ``apexrl plot`` (``plot``) and ``apexrl stop`` (``stop``)."""
