"""One module per cloud behind one interface.

* ``rules``: the pure interface (``CloudRules``) that config validation asks; each cloud's
  ``<cloud>_catalog`` module implements it with tables and naming rules (no Pulumi import).
* ``base``: the Pulumi interface (``CloudBuilder``); each cloud's ``<cloud>`` module builds the
  cluster as ComponentResources.

Both are looked up by name in registries (``rules.CLOUD_CATALOGS``, ``base.CLOUD_BUILDERS``) and
imported on first use. Adding a cloud means adding its two modules and two registry entries.
"""
