"""The KV cache: block accounting and the storage behind it. block_pool.py keeps the pages,
cold slots, reference counts, the LRU free queue and the prefix index; block_manager.py
gives sequences their block tables over it (admission with prefix-cache hits, growth,
swap out and in, cooling to cold blocks), called by the scheduler only. kv_cache.py holds
the bytes: the device arena, the host swap pool and the copies between them, with the
cold-block quantizers of kv_quant.py."""
