"""Studies built from wtc's tools (`wtc study NAME`)."""
