"""--model-file: tiny GGUF files and config.json files written by the tests."""

import json
import os
import struct
import tempfile
import unittest

from support import ScratchTest, main, run_cli, run_json

F32, F16, Q4_0, Q8_0, Q4_K, Q6_K = 0, 1, 2, 8, 12, 14
UINT32, FLOAT32, STRING, ARRAY = 4, 6, 8, 9


def gguf_string(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def gguf_value(kind, value):
    if kind == STRING:
        return gguf_string(value)
    if kind == ARRAY:
        item_kind, items = value
        return struct.pack("<IQ", item_kind, len(items)) + b"".join(gguf_value(item_kind, v) for v in items)
    return struct.pack({UINT32: "<I", FLOAT32: "<f"}[kind], value)


def tensor_bytes(shape, kind):
    _, block, block_bytes = main.GGML_TYPES[kind]
    elements = 1
    for size in shape:
        elements *= size
    return elements // block * block_bytes


def gguf_bytes(metadata, tensors, version=3, data=True):
    """A GGUF file: metadata [(key, kind, value)], tensors [(name, shape, ggml type)], then
    zeroed tensor data at 32-byte aligned offsets (data=False: the header alone)."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata))
    for key, kind, value in metadata:
        out += gguf_string(key) + struct.pack("<I", kind) + gguf_value(kind, value)
    offset = 0
    for name, shape, kind in tensors:
        out += gguf_string(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
        out += struct.pack("<IQ", kind, offset)
        if kind in main.GGML_TYPES:
            offset += -(-tensor_bytes(shape, kind) // 32) * 32
    if not data:
        return out
    return out + bytes(-len(out) % 32) + bytes(offset)


def llama_like(head_count_kv=2, extra=(), tensors=None, data=True):
    metadata = [("general.architecture", STRING, "llama"), ("llama.block_count", UINT32, 2),
                ("llama.embedding_length", UINT32, 256), ("llama.attention.head_count", UINT32, 8),
                ("tokenizer.ggml.tokens", ARRAY, (STRING, [f"t{i}" for i in range(5000)]))]
    if head_count_kv is not None:
        metadata.append(("llama.attention.head_count_kv", UINT32, head_count_kv))
    metadata += list(extra)
    if tensors is None:
        tensors = [("token_embd.weight", [256, 1000], Q8_0),    # 256,000 params, 8,000 blocks x 34
                   ("blk.0.attn_q.weight", [256, 256], Q4_K),   # 65,536 params, 256 blocks x 144
                   ("blk.0.ffn_down.weight", [256, 512], Q6_K), # 131,072 params, 512 blocks x 210
                   ("blk.1.attn_q.weight", [256, 256], F16),    # 65,536 params x 2
                   ("blk.1.ffn_up.weight", [256, 512], Q4_0),   # 131,072 params, 4,096 blocks x 18
                   ("output_norm.weight", [256], F32)]          # 256 params x 4
    return gguf_bytes(metadata, tensors, data=data)


class ModelFileTest(ScratchTest):

    def assert_file_error(self, path, fragment):
        self.assert_usage_error(("capacity", "--model-file", path), f"--model-file {path}: {fragment}")

    def test_gguf_gives_parameters_and_the_real_bytes_of_mixed_quant_types(self):
        model = main.model_from_file(self.write("tiny-mixed.gguf", llama_like()))
        self.assertEqual(model.params, 256_000 + 65_536 + 131_072 + 65_536 + 131_072 + 256)
        self.assertEqual(model.weight_bytes, 8_000 * 34 + 256 * 144 + 512 * 210 + 65_536 * 2 + 4_096 * 18 + 256 * 4)
        self.assertEqual((model.name, model.layers, model.kv_heads, model.head_dim), ("tiny-mixed", 2, 2, 32))
        self.assertEqual(model.kv_bytes_per_token, 2 * 2 * 2 * 32 * 2)

    def test_gguf_without_an_output_tensor_ties_the_embedding_to_the_head(self):
        model = main.model_from_file(self.write("tied.gguf", llama_like()))
        self.assertEqual((model.head_params, model.embedding_params), (256_000, 0))

    def test_gguf_with_an_output_tensor_has_a_separate_head_and_embedding(self):
        tensors = [("token_embd.weight", [256, 1000], Q8_0), ("output.weight", [256, 1000], Q6_K),
                   ("blk.0.attn_q.weight", [256, 256], F16)]
        model = main.model_from_file(self.write("untied.gguf", llama_like(tensors=tensors)))
        self.assertEqual((model.head_params, model.embedding_params, model.body_params), (256_000, 256_000, 65_536))

    def test_gguf_mixture_of_experts_reads_the_expert_counts_and_the_stacked_expert_tensors(self):
        extra = [("llama.expert_count", UINT32, 8), ("llama.expert_used_count", UINT32, 2)]
        tensors = [("token_embd.weight", [256, 1000], Q8_0),            # 256,000 params
                   ("blk.0.ffn_gate_exps.weight", [256, 128, 8], Q8_0),  # 8 experts x 32,768 params
                   ("blk.0.ffn_up_exps.weight", [256, 128, 8], Q8_0),
                   ("blk.0.ffn_down_exps.weight", [128, 256, 8], Q8_0),
                   ("blk.1.ffn_gate_exps.weight", [256, 128, 8], Q8_0),
                   ("blk.1.ffn_up_exps.weight", [256, 128, 8], Q8_0),
                   ("blk.1.ffn_down_exps.weight", [128, 256, 8], Q8_0)]
        model = main.model_from_file(self.write("moe.gguf", llama_like(extra=extra, tensors=tensors)))
        # one expert in one layer: gate, up and down of 256 x 128 = 98,304 params
        self.assertEqual((model.num_experts, model.num_experts_per_tok, model.num_moe_layers, model.expert_params),
                         (8, 2, 2, 98_304))
        self.assertEqual(model.params, 256_000 + 6 * 262_144)
        self.assertEqual(model.body_params, 2 * 2 * 98_304)  # the 2 routed experts of each layer; the embedding aside

    def test_gguf_without_head_count_kv_is_multi_head_attention(self):
        model = main.model_from_file(self.write("mha.gguf", llama_like(head_count_kv=None)))
        self.assertEqual(model.kv_heads, 8)

    def test_gguf_key_length_overrides_embedding_over_heads(self):
        extra = [("llama.attention.key_length", UINT32, 128), ("llama.attention.value_length", UINT32, 128)]
        model = main.model_from_file(self.write("keylen.gguf", llama_like(extra=extra)))
        self.assertEqual(model.head_dim, 128)

    def test_gguf_per_layer_kv_head_counts_size_the_cache_by_the_largest(self):
        metadata = llama_like(head_count_kv=None, extra=[("llama.attention.head_count_kv", ARRAY, (UINT32, [1, 4]))])
        self.assertEqual(main.model_from_file(self.write("per-layer.gguf", metadata)).kv_heads, 4)

    def test_capacity_reads_a_gguf_model_file(self):
        path = self.write("tiny.gguf", llama_like())
        code, out, err = run_cli("capacity", "--hardware", "cpu-4vcpu", "--model-file", path, "--kv-tokens", "1024")
        self.assertEqual((code, err), (0, ""))
        self.assertIn("capacity tiny on cpu-4vcpu", out)
        self.assertIn("kv per token    0.5 KiB     2 x 2 layers x 2 kv heads x 32 head dim x 2 bytes", out)

    def test_simulate_and_sweep_take_a_model_file(self):
        path = self.write("tiny.gguf", llama_like())
        report = run_json("simulate", "--hardware", "cpu-4vcpu", "--model-file", path, "--kv-tokens", "4096",
                          "--concurrency", "2", "--requests", "4", "--prompt-tokens", "16", "--output-tokens", "8")
        self.assertEqual((report["settings"]["model"], report["summary"]["num_completed"]), ("tiny", 4))
        self.assertEqual(run_cli("sweep", "--hardware", "cpu-4vcpu", "--model-file", path, "--kv-tokens", "4096",
                                 "--concurrency", "1,2", "--requests", "2", "--output-tokens", "4")[0], 0)

    def test_a_truncated_gguf_exits_2_saying_where(self):
        data = llama_like(data=False)
        self.assert_file_error(self.write("cut.gguf", data[: len(data) - 30]), "truncated while reading")
        self.assert_file_error(self.write("cut2.gguf", data[:10]), "truncated while reading the tensor count")

    def test_a_gguf_whose_tensor_data_is_cut_short_exits_2(self):
        data = llama_like()
        self.assert_file_error(self.write("short.gguf", data[:-100]), "tensor output_norm.weight ends past the end "
                                                                     "of the file (truncated or damaged")
        self.assertEqual(main.model_from_file(self.write("whole.gguf", data)).params, 649_472)

    def test_an_unknown_tensor_type_exits_2(self):
        data = llama_like(tensors=[("blk.0.attn_q.weight", [256, 256], 99)])
        self.assert_file_error(self.write("odd.gguf", data), "tensor blk.0.attn_q.weight has unknown ggml type 99")

    def test_a_tensor_that_does_not_fill_its_blocks_exits_2(self):
        data = llama_like(tensors=[("blk.0.attn_q.weight", [100, 3], Q4_K)])
        self.assert_file_error(self.write("ragged.gguf", data),
                                "tensor blk.0.attn_q.weight has 300 elements, not a multiple of its 256-element blocks")

    def test_missing_metadata_and_old_versions_exit_2(self):
        no_layers = gguf_bytes([("general.architecture", STRING, "llama")], [("x", [32], F32)])
        self.assert_file_error(self.write("nolayers.gguf", no_layers), "the GGUF metadata has no llama.block_count")
        self.assert_file_error(self.write("v1.gguf", b"GGUF" + struct.pack("<I", 1) + b"\0" * 16),
                                "GGUF version 1 is not supported")

    def test_a_file_that_is_neither_gguf_nor_json_exits_2(self):
        self.assert_file_error(self.write("model.bin", b"\x00\x01garbage"), "not JSON")
        code, _, err = run_cli("capacity", "--model-file", "/nonexistent/model.gguf")
        self.assertEqual(code, 2)
        self.assertIn("cannot read it", err)

    def test_model_and_model_file_together_exit_2(self):
        path = self.write("tiny.gguf", llama_like())
        code, _, err = run_cli("capacity", "--model", "llama-3.1-8b", "--model-file", path)
        self.assertEqual(code, 2)
        self.assertIn("--model and --model-file", err)


LLAMA_31_8B_CONFIG = {
    "_name_or_path": "meta-llama/Llama-3.1-8B", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "max_position_embeddings": 131072,
}


class ConfigJsonTest(ScratchTest):

    def config(self, **changes):
        config = dict(LLAMA_31_8B_CONFIG, **changes)
        return self.write("config.json", config)

    def test_llama_3_1_8b_config_counts_its_8_030_261_248_parameters(self):
        model = main.model_from_file(self.config())
        self.assertEqual(model.params, 8_030_261_248)
        self.assertEqual((model.layers, model.kv_heads, model.head_dim, model.bytes_per_param), (32, 8, 128, 2))
        self.assertEqual(model.name, "meta-llama/llama-3.1-8b")
        self.assertEqual((model.head_params, model.embedding_params), (128256 * 4096, 128256 * 4096))

    def test_capacity_from_config_matches_the_preset_plan(self):
        code, out, _ = run_cli("capacity", "--hardware", "l4-24gb", "--model-file", self.config())
        self.assertEqual(code, 0)
        self.assertIn("blocks          1,941 x 16 tokens = 31,056 tokens", out)

    def test_tied_embeddings_are_counted_once_and_head_dim_is_read(self):
        untied = main.model_from_file(self.config()).params
        tied = main.model_from_file(self.config(tie_word_embeddings=True, head_dim=256)).params
        # one 128,256 x 4,096 matrix fewer; q/k/v/o grow with a 256 head dim
        attention_growth = 32 * (4096 * 32 * 128 * 2 + 4096 * 8 * 128 * 2)
        self.assertEqual(tied, untied - 128256 * 4096 + attention_growth)
        model = main.model_from_file(self.config(tie_word_embeddings=True))
        self.assertEqual((model.head_params, model.embedding_params), (128256 * 4096, 0))

    def test_dtype_sets_bytes_per_parameter(self):
        self.assertEqual(main.model_from_file(self.config(torch_dtype="float32")).bytes_per_param, 4)
        self.assertEqual(main.model_from_file(self.config(torch_dtype="float8_e4m3fn")).bytes_per_param, 1)

    def test_multimodal_configs_are_read_from_text_config(self):
        path = self.write("config.json", {"_name_or_path": "vlm", "torch_dtype": "bfloat16",
                                          "text_config": dict(LLAMA_31_8B_CONFIG)})
        self.assertEqual(main.model_from_file(path).params, 8_030_261_248)

    # Llama 3.1 8B: of its 8,030,261,248 parameters, 2 x 128,256 x 4,096 = 1,050,673,152 are the
    # embedding and the head (kept in BF16, two bytes each); the other 6,979,588,096 are quantized.
    QUANTIZED, KEPT_BYTES = 6_979_588_096, 2 * 1_050_673_152

    def quantized(self, quantization_config):
        return main.model_from_file(self.config(quantization_config=quantization_config))

    def test_fp8_checkpoints_hold_a_byte_per_weight_and_compute_in_fp8(self):
        w8a8 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
            "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}}
        for config in (w8a8, {"quant_method": "fp8", "activation_scheme": "dynamic"},
                       {"quant_method": "fbgemm_fp8"}, {"quant_method": "modelopt", "quant_algo": "FP8"}):
            model = self.quantized(config)
            self.assertAlmostEqual(model.weight_bytes, self.QUANTIZED + self.KEPT_BYTES, delta=1, msg=config)
            self.assertTrue(model.fp8_compute, config)

    def test_four_bit_checkpoints_count_their_scales(self):
        w4a16 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
            "weights": {"num_bits": 4, "type": "int", "group_size": 128, "symmetric": True}}}}
        nvfp4 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
            "weights": {"num_bits": 4, "type": "float", "group_size": 16},
            "input_activations": {"num_bits": 4, "type": "float"}}}}
        for config, bits in (({"quant_method": "awq", "bits": 4, "group_size": 128}, 4.25),  # + 32 / 128
                             ({"quant_method": "gptq", "bits": 8, "group_size": -1}, 8),    # per channel
                             (w4a16, 4.125),                                               # + 16 / 128
                             (nvfp4, 4.5),                                                 # + 8 / 16
                             ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 4.5)):  # + 32 / 64
            model = self.quantized(config)
            self.assertAlmostEqual(model.weight_bytes, self.QUANTIZED * bits / 8 + self.KEPT_BYTES, delta=1, msg=config)
            self.assertFalse(model.fp8_compute, config)

    def test_an_ignore_list_keeps_the_attention_it_names_in_16_bits(self):
        w8a8 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
            "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"},
            "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}}
        # Llama 3.1 8B's attention: 32 layers x (4,096 x (4,096 + 2 x 1,024) + 4,096 x 4,096) = 1,342,177,280
        attention = 1_342_177_280
        for ignore in (["re:.*lm_head", "re:.*self_attn", "re:vision_model.*"], ["lm_head", "LlamaAttention"]):
            model = self.quantized(dict(w8a8, ignore=ignore))
            self.assertAlmostEqual(model.weight_bytes, self.QUANTIZED + self.KEPT_BYTES + attention, delta=1,
                                   msg=ignore)
        for ignore in (["lm_head"], ["re:.*mlp.*"], ["model.layers.0.self_attn.q_proj"]):  # single modules: not counted
            model = self.quantized(dict(w8a8, ignore=ignore))
            self.assertAlmostEqual(model.weight_bytes, self.QUANTIZED + self.KEPT_BYTES, delta=1, msg=ignore)
        broken = self.config(quantization_config=dict(w8a8, ignore=["re:(("]))
        code, _, err = run_cli("capacity", "--model-file", broken)
        self.assertEqual(code, 2)
        self.assertIn("quantization_config.ignore must be regular expressions after re:, got 're:((", err)

    def test_a_quantization_servesim_cannot_size_exits_2_unless_the_flag_gives_it(self):
        path = self.config(quantization_config={"quant_method": "hqq"})
        code, _, err = run_cli("capacity", "--model-file", path)
        self.assertEqual(code, 2)
        self.assertIn("quantization_config.quant_method 'hqq' is a format servesim does not size; give --quantization",
                      err)
        code, out, _ = run_cli("capacity", "--model-file", path, "--quantization", "int4")
        self.assertEqual(code, 0, out)

    def test_bad_configs_exit_2_naming_what_is_wrong(self):
        for changes, fragment in ((dict(num_hidden_layers=None), "num_hidden_layers must be a positive integer"),
                                  (dict(torch_dtype="int3"), "torch_dtype 'int3'"),
                                  (dict(num_local_experts=8), "num_experts_per_tok must be a positive integer, got nothing"),
                                  (dict(num_local_experts=8, num_experts_per_tok=9),
                                   "num_experts_per_tok must be at most num_local_experts (8), got 9")):
            code, _, err = run_cli("capacity", "--model-file", self.config(**changes))
            self.assertEqual(code, 2)
            self.assertIn(fragment, err)


if __name__ == "__main__":
    unittest.main()
