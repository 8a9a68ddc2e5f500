#!/usr/bin/python3
"""Independent NumPy reference of the decoder architectures kvpush's CPU executor serves.

Reads a GGUF file with its own small reader (GGUF v3 layout as documented in ggml's
docs/gguf.md) and computes the logits of every position of a prompt in float64, following the
published models as HF transformers writes them (modeling_llama.py, modeling_qwen2.py,
modeling_qwen3.py), not kvpush's code:

  x = embed[tokens]
  per layer:  h = rmsnorm(x) * attn_norm
              q, k, v = h Wq^T (+ bq), h Wk^T (+ bk), h Wv^T (+ bv)        (qwen2: biases)
              q, k = rmsnorm_per_head(q) * q_norm, ... * k_norm             (qwen3)
              q, k = q cos + rotate_half(q) sin, ...                        (HF RoPE)
              att = softmax(q k^T / sqrt(head_dim) + causal mask) v         (GQA: h // group)
              x += att Wo^T
              x += Wd (silu(Wg rmsnorm(x) * ffn_norm) * Wu (rmsnorm(x) * ffn_norm))
  logits = (rmsnorm(x) * output_norm) output^T      (output = token_embd when tied)

HF's RoPE is rotate_half (dims i and i + d/2). llama.cpp's converter permutes the rows of a
"llama" model's Wq / Wk so that llama.cpp can rotate adjacent pairs instead; this reference
undoes that permutation and applies HF's formula, so it checks the executor's reading of the
file as well as its arithmetic. Llama 3.1 "llama3" RoPE scaling arrives as rope_freqs.weight
(the converter's per-pair factors): inv_freq[i] /= rope_freqs[i].

Weights are dequantized from their stored ggml type with the formats as ggml publishes them
(ggml-common.h block_q8_0 / block_q4_K / block_q6_K, ggml-quants.c dequantize_row_*), written
here from that description: the K-quant products are evaluated in float32 in ggml's order, so the
dequantized values are exactly ggml's.

Usage: gguf_reference.py MODEL.gguf TOKENS.i32 OUT.f64
  TOKENS.i32: little-endian int32 token ids; OUT.f64: little-endian float64 logits [n, vocab].
       gguf_reference.py --dequant MODEL.gguf TENSOR OUT.f32
  writes tensor TENSOR dequantized to little-endian float32 (ne[0] innermost).
Exit status 3 when numpy is missing (the ctest skips on it).
"""
import struct
import sys

try:
    import numpy as np
except ImportError:  # pragma: no cover
    sys.stderr.write("gguf_reference.py: python3-numpy is not installed\n")
    sys.exit(3)

# ggml types this reader dequantizes: F32, F16, Q8_0, Q4_K, Q6_K, BF16.
F32, F16, Q8_0, Q4_K, Q6_K, BF16 = 0, 1, 8, 12, 14, 30
QK_K = 256
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
          11: "<q", 12: "<d"}


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return [self.value(et) for _ in range(n)]
        return self.take(SCALAR[t])


def dequant_q4_k(raw, nb):
    """block_q4_K: f16 d, f16 dmin, 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles.
    Sub-block j (32 values): j < 4: sc = s[j] & 63, m = s[j+4] & 63; j >= 4:
    sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4, m = (s[j+4] >> 4) | (s[j] >> 6) << 4.
    Values 64i..64i+31 are the low nibbles of qs[32i..32i+31], the next 32 the high nibbles.
    value = (d * sc) * q - dmin * m in float32."""
    b = np.frombuffer(raw, np.uint8, nb * 144).reshape(nb, 144)
    d = b[:, 0:2].copy().view("<f2").astype(np.float32)
    dmin = b[:, 2:4].copy().view("<f2").astype(np.float32)
    s = b[:, 4:16].astype(np.int32)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    qs = b[:, 16:].reshape(nb, 4, 1, 32)
    q = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(nb, 8, 32).astype(np.float32)
    scale = (d * sc.astype(np.float32))[:, :, None]
    offset = (dmin * mn.astype(np.float32))[:, :, None]
    return (scale * q - offset).reshape(-1)


def dequant_q6_k(raw, nb):
    """block_q6_K: ql[128] low nibbles, qh[64] high 2-bit pairs, int8 scales[16], f16 d.
    Half h (128 values) uses ql[64h..], qh[32h..]; for l < 32 the codes of values l, l+32, l+64,
    l+96 are ql[l] & 15, ql[l+32] & 15, ql[l] >> 4, ql[l+32] >> 4 with bits 0-1, 2-3, 4-5, 6-7 of
    qh[l] as bits 4-5. value i = (d * scales[i // 16]) * (code - 32) in float32."""
    b = np.frombuffer(raw, np.uint8, nb * 210).reshape(nb, 210)
    ql = b[:, 0:128].reshape(nb, 2, 64).astype(np.int32)
    qh = b[:, 128:192].reshape(nb, 2, 32).astype(np.int32)
    sc = b[:, 192:208].copy().view(np.int8).astype(np.float32)
    d = b[:, 208:210].copy().view("<f2").astype(np.float32)
    lo, hi = ql[:, :, 0:32], ql[:, :, 32:64]
    codes = np.concatenate([(lo & 15) | (((qh >> 0) & 3) << 4),
                            (hi & 15) | (((qh >> 2) & 3) << 4),
                            (lo >> 4) | (((qh >> 4) & 3) << 4),
                            (hi >> 4) | (((qh >> 6) & 3) << 4)], axis=2).reshape(nb, 256)
    scale = np.repeat(d * sc, 16, axis=1)
    return (scale * (codes - 32).astype(np.float32)).reshape(-1)


def dequantize(data, t, n, start, name):
    """n values of ggml type t at data[start:] as float32 (exactly ggml's dequantized values)."""
    if t == F32:
        return np.frombuffer(data, "<f4", n, start).astype(np.float32)
    if t == F16:
        return np.frombuffer(data, "<f2", n, start).astype(np.float32)
    if t == BF16:
        u = np.frombuffer(data, "<u2", n, start).astype(np.uint32) << 16
        return u.view(np.float32)
    if t == Q8_0:  # blocks of 32: f16 scale d, 32 int8 q; value = d * q
        blocks = np.frombuffer(data, np.uint8, n // 32 * 34, start).reshape(-1, 34)
        d = blocks[:, :2].copy().view("<f2").astype(np.float32)
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    if t == Q4_K:
        return dequant_q4_k(data[start:start + n // QK_K * 144], n // QK_K)
    if t == Q6_K:
        return dequant_q6_k(data[start:start + n // QK_K * 210], n // QK_K)
    raise ValueError("tensor %s: ggml type %d not supported by the reference" % (name, t))


def read_gguf(path, dtype=np.float64):
    """Returns (metadata dict, {name: array of `dtype` shaped [ne_{n-1}, ..., ne_0]})."""
    with open(path, "rb") as f:
        data = f.read()
    r = Reader(data)
    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    r.pos = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    if version != 3:
        raise ValueError("GGUF version %d" % version)
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        ne = [r.take("<Q") for _ in range(r.take("<I"))]
        infos.append((name, ne, r.take("<I"), r.take("<Q")))
    align = meta.get("general.alignment", 32)
    base = (r.pos + align - 1) // align * align
    tensors = {}
    for name, ne, t, off in infos:
        a = dequantize(data, t, int(np.prod(ne)), base + off, name).astype(dtype)
        tensors[name] = a.reshape(list(reversed(ne)))
    return meta, tensors


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def unpermute(w, n_head):
    """Inverse of llama.cpp convert_hf_to_gguf.py's permute() of Wq / Wk rows (or a bias)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rope(x, pos, inv_freq):
    """HF apply_rotary_pos_emb on the first 2 * len(inv_freq) dims of x [n, heads, hd]."""
    rd = 2 * len(inv_freq)
    ang = np.outer(pos, inv_freq)  # [n, rd / 2]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    xr = x[..., :rd]
    rot = np.concatenate([-xr[..., rd // 2:], xr[..., :rd // 2]], axis=-1)
    return np.concatenate([xr * cos + rot * sin, x[..., rd:]], axis=-1)


def forward(meta, t, tokens):
    arch = meta["general.architecture"]
    if arch not in ("llama", "qwen2", "qwen3"):
        raise ValueError("architecture %s not in the reference" % arch)
    a = arch + "."
    dim = meta[a + "embedding_length"]
    n_head = meta[a + "attention.head_count"]
    n_kv = meta.get(a + "attention.head_count_kv", n_head)
    hd = meta.get(a + "attention.key_length", dim // n_head)
    rd = meta.get(a + "rope.dimension_count", hd)
    base = meta.get(a + "rope.freq_base", 10000.0)
    eps = meta.get(a + "attention.layer_norm_rms_epsilon", 1e-5)
    inv_freq = 1.0 / base ** (np.arange(0, rd, 2, dtype=np.float64) / rd)
    if "rope_freqs.weight" in t:
        inv_freq = inv_freq / t["rope_freqs.weight"]
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    mask = np.triu(np.full((n, n), -np.inf), 1)
    x = t["token_embd.weight"][tokens]
    for layer in range(meta[a + "block_count"]):
        p = "blk.%d." % layer
        g = lambda name: t.get(p + name)  # noqa: E731
        h = rmsnorm(x, g("attn_norm.weight"), eps)
        wq, wk = g("attn_q.weight"), g("attn_k.weight")
        bq, bk, bv = g("attn_q.bias"), g("attn_k.bias"), g("attn_v.bias")
        if arch == "llama":  # back to HF's row order (rotate_half layout)
            wq, wk = unpermute(wq, n_head), unpermute(wk, n_kv)
            bq = None if bq is None else unpermute(bq, n_head)
            bk = None if bk is None else unpermute(bk, n_kv)
        q, k, v = h @ wq.T, h @ wk.T, h @ g("attn_v.weight").T
        q = q if bq is None else q + bq
        k = k if bk is None else k + bk
        v = v if bv is None else v + bv
        q, k, v = q.reshape(n, n_head, hd), k.reshape(n, n_kv, hd), v.reshape(n, n_kv, hd)
        if g("attn_q_norm.weight") is not None:  # Qwen3: RMSNorm over each head's dims
            q = rmsnorm(q, g("attn_q_norm.weight"), eps)
            k = rmsnorm(k, g("attn_k_norm.weight"), eps)
        q, k = rope(q, pos, inv_freq), rope(k, pos, inv_freq)
        group = n_head // n_kv
        att = np.empty((n, n_head, hd))
        for head in range(n_head):
            kh, vh = k[:, head // group, :], v[:, head // group, :]
            s = q[:, head, :] @ kh.T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            att[:, head, :] = (s / s.sum(axis=-1, keepdims=True)) @ vh
        x = x + att.reshape(n, n_head * hd) @ g("attn_output.weight").T
        h = rmsnorm(x, g("ffn_norm.weight"), eps)
        gate = h @ g("ffn_gate.weight").T
        x = x + ((gate / (1.0 + np.exp(-gate))) * (h @ g("ffn_up.weight").T)) @ \
            g("ffn_down.weight").T
    out = t.get("output.weight", t["token_embd.weight"])
    return rmsnorm(x, t["output_norm.weight"], eps) @ out.T


def main(argv):
    if len(argv) == 5 and argv[1] == "--dequant":
        _, tensors = read_gguf(argv[2], np.float32)
        tensors[argv[3]].astype("<f4").tofile(argv[4])
        return 0
    if len(argv) != 4:
        sys.stderr.write(__doc__)
        return 2
    meta, tensors = read_gguf(argv[1])
    tokens = np.fromfile(argv[2], dtype="<i4")
    logits = forward(meta, tensors, tokens)
    logits.astype("<f8").tofile(argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
