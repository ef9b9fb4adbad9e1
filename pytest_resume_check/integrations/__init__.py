"""Ready-made glue between popular trainers and the run context (one module per framework; each is
imported only where its framework is installed)."""
