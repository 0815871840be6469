"""The store format: layout, codecs, shard I/O, records, reading, writing, verify and gc."""
