"""The toolkit's data, framework-free, bottom up (a module imports only modules listed before it):

    batch.py           what a batch is (leaves of tuples, lists, dicts): its size, `fn` on each leaf
    sampler.py         which samples each replica takes of an in-memory dataset (`Sampler`)
    stream_sampler.py  which samples of a sharded stream each rank reads, and its position (`StreamSampler`)
    ondisk.py          `imagefolder:`, `cifar10:`, `text:` checked once, read into numpy or file lists
    streams.py         the shard index (index.json) and a loader's handle on it (`ShardSource`, toolkit.shards)
    shardwrite.py      `toolkit shards`: a dataset written as a framework's shards with their index
    datasets.py        what `--dataset` means: the built-in, on-disk, sharded or user's datasets (`Datasets`)
    loader.py          a session's loaders (`Loader`, `StreamLoader`, `ForeignLoader`), given the session

The frameworks' own readers and writers are adapters/<framework>/images.py and shards.py, reached
through toolkit.registry.reader. Nothing here imports a framework or numpy at import time.
"""
