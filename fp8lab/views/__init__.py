"""What people look at: figures from analysis tables (``plots``), notebook 01's format figures (``formats``),
the HTML report and the generated docs (``report``). Imports every folder below; nothing imports it but the face."""
