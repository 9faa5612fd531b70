"""The example repository's pipelines end to end. The text-embedding pipeline:
`text_embedding` = bert_tokenizer (WASM) → minilm (ONNX, all-MiniLM-L6-v2
built from safetensors) → embed_pool (WASM), compared with
sentence-transformers' own output (tests/data/minilm_reference.json, made by
scripts/minilm_reference.py) over HTTP and gRPC, one sentence per request,
one batch of all sentences, and many concurrent requests. Greedy decoding
in-process: `greedy_decoder` (WASM) calling `tiny_lm` (ONNX) over BLS once
per token, checked against the same loop in numpy."""

import json
import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, Tern

import gen_models

REPO = os.path.join(ROOT, "model_repository")
REFERENCE = json.load(open(os.path.join(ROOT, "tests", "data", "minilm_reference.json")))


@pytest.fixture(scope="module")
def tsrv(tmp_path_factory):
    for f in ("minilm/1/model.onnx", "bert_tokenizer/1/vocab.txt", "bert_tokenizer/1/model.wasm", "embed_pool/1/model.wasm"):
        if not os.path.exists(os.path.join(REPO, f)):
            pytest.fail(f"model_repository/{f} is missing; run `make setup`")
    cache = str(tmp_path_factory.mktemp("wasm-cache"))
    t = Tern([f"--model-repository={REPO}", f"--wasm-cache-dir={cache}"])
    yield t
    t.stop()


def text_input(client, sentences):
    i = client.InferInput("TEXT", [len(sentences), 1], "BYTES")
    i.set_data_from_numpy(np.array([[s.encode()] for s in sentences], dtype=np.object_))
    return i


def assert_close(embeddings, refs):
    assert len(embeddings) == len(refs)
    for i, (e, r) in enumerate(zip(embeddings, refs)):
        r = np.asarray(r, dtype=np.float64)
        cos = float(e @ r / np.linalg.norm(e) / np.linalg.norm(r))
        assert cos >= 1 - 1e-4, (REFERENCE["sentences"][i % len(REFERENCE["sentences"])], cos)
        assert abs(np.linalg.norm(e) - 1) < 1e-5


def test_tokenizer_matches_hugging_face(tsrv):
    c = httpclient.InferenceServerClient(tsrv.url)
    for sentence, ids in zip(REFERENCE["sentences"], REFERENCE["input_ids"]):
        r = c.infer("bert_tokenizer", [text_input(httpclient, [sentence])])
        assert r.as_numpy("input_ids")[0].tolist() == ids, sentence
        assert r.as_numpy("attention_mask")[0].tolist() == [1] * len(ids)
        assert not r.as_numpy("token_type_ids").any()
    # A batch is padded to its longest text, with the mask marking the padding.
    r = c.infer("bert_tokenizer", [text_input(httpclient, ["hello", "a much longer sentence than that"])])
    ids, mask = r.as_numpy("input_ids"), r.as_numpy("attention_mask")
    assert ids.shape == mask.shape == (2, 8)
    assert mask[0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0] and ids[0, 3:].tolist() == [0] * 5


def random_texts(n, seed=7):
    """Texts mixing what BERT's basic tokenizer treats specially: ASCII words
    and punctuation, Latin/Greek/Cyrillic/Arabic letters in both cases,
    accents precomposed and combining, CJK, controls, odd whitespace, long
    words, final sigma, dotted capital I."""
    rng = np.random.default_rng(seed)
    words = ["hello", "WORLD", "unaffable", "Café", "naïve", "ΣΟΦΙΑ", "ΟΔΟΣ", "Москва", "İstanbul",
             "straße", "ﬁne", "e\u0301", "\u0301", "中文字", "日本語", "한국어", "مرحبا،", "¿Qué?", "«quote»",
             "x" * 120, "hyperparameterization", "don't", "3.14", "@user", "#tag", "\u00ad", "\u200b", "\ufffd"]
    pieces = ["a", "Z", "9", ".", "-", "'", " ", "\t", "\n", "\u00a0", "\u3000", "\x07", "\x7f",
              "é", "Å", "ß", "ø", "Ω", "ж", "ё", "ª", "·", "—", "…", "€", "™", "ǅ", "ﬀ", "\u0345"]
    pieces += [chr(c) for c in rng.integers(0x80, 0x800, 40)]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(int(rng.integers(1, 12))):
            if rng.random() < 0.5:
                parts.append(words[int(rng.integers(len(words)))])
            else:
                parts.append("".join(pieces[int(k)] for k in rng.integers(len(pieces), size=int(rng.integers(1, 6)))))
            parts.append(" " if rng.random() < 0.8 else "")
        out.append("".join(parts))
    return out


def test_tokenizer_matches_hugging_face_on_random_text(tsrv):
    from tokenizers import BertWordPieceTokenizer

    hf = BertWordPieceTokenizer(os.path.join(REPO, "bert_tokenizer", "1", "vocab.txt"), lowercase=True)
    c = httpclient.InferenceServerClient(tsrv.url)
    texts = random_texts(320)
    for k in range(0, len(texts), 64):  # the model's max_batch_size
        r = c.infer("bert_tokenizer", [text_input(httpclient, texts[k : k + 64])])
        ids, mask = r.as_numpy("input_ids"), r.as_numpy("attention_mask")
        for row, m, text in zip(ids, mask, texts[k : k + 64]):
            want = hf.encode(text).ids
            if len(want) > 256:  # the plugin's max_length keeps [CLS] ... [SEP]
                want = want[:255] + want[-1:]
            assert row[m == 1].tolist() == want, repr(text)


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_embeddings_match_sentence_transformers(tsrv, proto):
    client = httpclient if proto == "http" else grpcclient
    c = client.InferenceServerClient(tsrv.url if proto == "http" else tsrv.grpc_url)
    sentences = REFERENCE["sentences"]
    singles = [c.infer("text_embedding", [text_input(client, [s])]).as_numpy("EMBEDDING")[0] for s in sentences]
    assert_close(singles, REFERENCE["embeddings"])
    batch = c.infer("text_embedding", [text_input(client, sentences)]).as_numpy("EMBEDDING")
    assert batch.shape == (len(sentences), 384)
    assert_close(batch, REFERENCE["embeddings"])


def test_concurrent_requests_batch_and_stay_correct(tsrv):
    c = httpclient.InferenceServerClient(tsrv.url, concurrency=16)
    sentences = REFERENCE["sentences"] * 4
    pending = [c.async_infer("text_embedding", [text_input(httpclient, [s])]) for s in sentences]
    got = [p.get_result().as_numpy("EMBEDDING")[0] for p in pending]
    assert_close(got, REFERENCE["embeddings"] * 4)
    stats = c.get_inference_statistics("minilm")["model_stats"][0]
    assert stats["inference_count"] >= len(sentences)


def expected_generation(prompt, max_new=16, eos=0):
    table = gen_models.tiny_lm_weights()
    ids, out = list(prompt), []
    while len(out) < max_new:
        nxt = int(np.argmax(table[ids[-1]]))
        out.append(nxt)
        if nxt == eos:
            break
        ids.append(nxt)
    return out


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_greedy_decoding_over_bls(tsrv, proto):
    client = httpclient if proto == "http" else grpcclient
    c = client.InferenceServerClient(tsrv.url if proto == "http" else tsrv.grpc_url)
    before = c.get_inference_statistics("tiny_lm")
    before = before["model_stats"][0]["inference_count"] if proto == "http" else before.model_stats[0].inference_count
    calls = 0
    for prompt in ([1], [5, 9, 3], list(range(1, 20))):
        i = client.InferInput("input_ids", [1, len(prompt)], "INT64")
        i.set_data_from_numpy(np.array([prompt], dtype=np.int64))
        got = c.infer("greedy_decoder", [i]).as_numpy("output_ids")[0].tolist()
        want = expected_generation(prompt)
        assert got == want, (prompt, got, want)
        calls += len(want)
    after = c.get_inference_statistics("tiny_lm")
    after = after["model_stats"][0]["inference_count"] if proto == "http" else after.model_stats[0].inference_count
    assert after - before == calls  # one BLS call per generated token


def test_greedy_decoding_rejects_a_bad_prompt(tsrv):
    from tritonclient.utils import InferenceServerException

    c = httpclient.InferenceServerClient(tsrv.url)
    i = httpclient.InferInput("input_ids", [1, 1], "INT64")
    i.set_data_from_numpy(np.array([[99]], dtype=np.int64))
    with pytest.raises(InferenceServerException) as e:
        c.infer("greedy_decoder", [i])
    assert "tiny_lm" in str(e.value)
    i.set_data_from_numpy(np.array([[3]], dtype=np.int64))
    assert c.infer("greedy_decoder", [i]).as_numpy("output_ids")[0].tolist() == expected_generation([3])
