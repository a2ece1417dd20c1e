"""Python's litdata (PyPI) as the peer of lf::StreamingDataset / StreamingWriter / StreamingDataLoader.

  litdata_peer.py write KIND DIR          litdata.optimize writes a dataset (KIND: mixed, dicts, media, ids, ids-big;
                                          zstd compressed: ids-batch, mixed-sample, ids-chunk)
  litdata_peer.py dump DIR                every item, as StreamingDataset returns it, one canonical line each
  litdata_peer.py order DIR CONFIG...     the batches StreamingDataLoader yields, one line each:
                                          CONFIG = world,rank,num_workers,batch_size,shuffle,epochs[,drop_last or -[,seed]]

The canonical line of an item is what streaming_checks.cpp prints for the C++ reader's item.
"""
import os
import struct
import sys



if os.environ.get("AWS_ENDPOINT_URL", "").startswith("http://"):
    # litdata's obstore client refuses plain HTTP unless told; the tests' S3 server listens on
    # http://127.0.0.1 (the same requests, without TLS).
    import litdata.streaming.downloader as _downloader

    _downloader._OBSTORE_CLIENT_OPTIONS = {**_downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}

def canonical(value):
    import numpy as np
    import torch

    if isinstance(value, bool):
        return "b:%d" % value
    if isinstance(value, int):
        return "i:%d" % value
    if isinstance(value, float):
        return "f:" + struct.pack("<d", value).hex()
    if value is None:
        return "n"
    if isinstance(value, str):
        return "s:" + value.encode("utf-8").hex()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "s:" + bytes(value).hex()
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if hasattr(value, "mode") and hasattr(value, "tobytes") and not isinstance(value, torch.Tensor):  # PIL image
        value = torch.from_numpy(np.asarray(value).copy())
    if isinstance(value, torch.Tensor):
        t = value.contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return "t:%s:%s:%s" % (str(t.dtype).split(".")[1], ",".join(str(d) for d in t.shape), data.hex())
    if isinstance(value, tuple):
        return "(" + ",".join(canonical(v) for v in value) + ")"
    if isinstance(value, list):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join("%s=%s" % (k, canonical(v)) for k, v in value.items()) + "}"
    raise TypeError("no canonical form for %r" % type(value))


def make_images(folder, count):
    import numpy as np
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    rng = np.random.RandomState(7)
    for i in range(count):
        pixels = rng.randint(0, 256, size=(6 + i % 3, 9, 3), dtype=np.uint8)
        # EXIF orientations 1 to 8 on the even images (litdata turns those upright), none on the odd.
        extra = {}
        if i % 2 == 0:
            exif = Image.Exif()
            exif[0x0112] = i // 2 % 8 + 1
            extra["exif"] = exif.tobytes()
        Image.fromarray(pixels).save(os.path.join(folder, "%d.jpg" % i), quality=90, **extra)
        mode = ["RGB", "L", "RGBA"][i % 3]
        Image.fromarray(pixels).convert(mode).save(os.path.join(folder, "%d.png" % i))


def mixed_item(i):
    import numpy as np
    import torch

    g = torch.Generator().manual_seed(i)
    return (
        i,
        i * 0.5 - 3.25,
        i % 2 == 0,
        "item %d: \u00e9\u4e2d" % i,
        bytes(range(i % 7, i % 7 + 5)),
        np.arange(6, dtype=np.float32).reshape(2, 3) * i,
        np.arange(i % 4 + 1, dtype=np.int16),
        torch.rand(2, 2, generator=g, dtype=torch.float64),
        torch.arange(3, dtype=torch.int32) + i,
        torch.tensor(i, dtype=torch.int64),
        None,
        [i, (i + 1, "x" * (i % 3))],
    )


def dict_item(i):
    import numpy as np
    from PIL import Image

    images = os.environ["LF_PEER_IMAGES"]  # optimize's workers may be fresh processes
    return {
        "id": i,
        "name": "n%d" % i,
        "tags": ["a" * (i % 3), "b"],
        "scores": [float(i), 0.25],
        "nested": {"x": i / 3, "v": np.full((2, 2), i, dtype=np.uint8)},
        "jpeg": Image.open(os.path.join(images, "%d.jpg" % i)),
        "png": Image.open(os.path.join(images, "%d.png" % i)),
        "raw": b"\x00\x01" + bytes([i % 256]),
    }


def media_item(i):
    # litdata's typed leaves: a PNG stored as its bytes (Image: "image:png", decoded to RGB CHW), a
    # list of JPEGs ("jpeg_array"), UTF-8 text ("text") and a file's bytes ("file:bin").
    from litdata import File, Image, Text
    from PIL import Image as PILImage

    images = os.environ["LF_PEER_IMAGES"]
    frames = [PILImage.open(os.path.join(images, "%d.jpg" % k)) for k in (i, (i + 3) % 16)]
    payload = os.path.join(images, "payload-%d.bin" % i)
    with open(payload, "wb") as out:
        out.write(bytes((i * 7 + k) % 256 for k in range(40 + i)))
    return {
        "png": Image(path=os.path.join(images, "%d.png" % i)),
        "frames": frames,
        "text": Text(text="line %d: \u00e9\u4e2d" % i),
        "file": File(path=payload),
    }


def ids_item(i):
    import torch

    return (i, torch.full((4,), float(i)))


def write(kind, out):
    import litdata

    if kind == "dicts":
        os.environ["LF_PEER_IMAGES"] = out + "-images"
        make_images(out + "-images", 16)
        fn, inputs, sizes = dict_item, list(range(16)), {"chunk_size": 5}
    elif kind == "media":
        os.environ["LF_PEER_IMAGES"] = out + "-images"
        make_images(out + "-images", 16)
        fn, inputs, sizes = media_item, list(range(9)), {"chunk_size": 4}
    elif kind == "mixed":
        fn, inputs, sizes = mixed_item, list(range(23)), {"chunk_bytes": 1500}
    elif kind == "ids":
        fn, inputs, sizes = ids_item, list(range(int(os.environ.get("LF_IDS_ITEMS", "203")))), {"chunk_size": 17}
    elif kind == "ids-big":  # chunks of 600 items: larger than the 256-item shuffle window
        fn, inputs, sizes = ids_item, list(range(1500)), {"chunk_size": 600}
    elif kind == "ids-batch":  # litdata's default granularity: frames of 8 items, so chunks hold several
        fn, inputs, sizes = ids_item, list(range(203)), {"chunk_size": 17, "compression": "zstd", "compression_batch_size": 8}
    elif kind == "mixed-sample":
        fn, inputs, sizes = mixed_item, list(range(23)), {"chunk_bytes": 1500, "compression": "zstd:9", "compression_level": "sample"}
    elif kind == "ids-chunk":
        fn, inputs, sizes = ids_item, list(range(50)), {"chunk_size": 17, "compression": "zstd", "compression_level": "chunk"}
    else:
        raise SystemExit("unknown kind " + kind)
    litdata.optimize(fn=fn, inputs=inputs, output_dir=out, num_workers=1, mode=None, **sizes)


def dump(folder):
    from litdata import StreamingDataset

    dataset = StreamingDataset(folder)
    for i in range(len(dataset)):
        print(canonical(dataset[i]))


def order(folder, configs):
    from litdata import StreamingDataLoader, StreamingDataset

    for config in configs:
        parts = config.split(",")
        world, rank, workers, batch, shuffle, epochs = (int(p) for p in parts[:6])
        os.environ["WORLD_SIZE"], os.environ["GLOBAL_RANK"] = str(world), str(rank)
        kwargs = {}
        if len(parts) > 6 and parts[6] != "-":
            kwargs["drop_last"] = bool(int(parts[6]))
        if len(parts) > 7:
            kwargs["seed"] = int(parts[7])
        dataset = StreamingDataset(folder, shuffle=bool(shuffle), **kwargs)
        loader = StreamingDataLoader(dataset, batch_size=batch, num_workers=workers)
        for epoch in range(1, epochs + 1):
            for batch_data in loader:
                ids = batch_data[0].tolist()
                print("%s epoch %d: %s" % (config, epoch, " ".join(str(i) for i in ids)))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "write":
        write(sys.argv[2], sys.argv[3])
    elif command == "dump":
        dump(sys.argv[2])
    elif command == "order":
        order(sys.argv[2], sys.argv[3:])
    else:
        raise SystemExit("usage: litdata_peer.py write|dump|order ...")
