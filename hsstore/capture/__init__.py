"""Building variants: manifest, inputs, models and backends, capture pipeline, workers, driver."""
