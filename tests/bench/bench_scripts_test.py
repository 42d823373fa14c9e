#!/usr/bin/env python3
"""Tests of the benchmark's analysis scripts, on fixtures made here (standard library only):
bench/attribute_profile.py on a small Chrome trace shaped like Kineto's GPU traces (two CPU
threads, correlation ids, two streams, a memcpy, idle gaps: every row known in advance),
bench/memory_peak.py on the allocator's [memory] events of such a trace,
bench/summarize.py on progress events shaped like `qloractl watch -o json`, and bench/flops.py
against the LLaMA-2-7B figures of shared/reference/peers.md.
  python3 tests/bench/bench_scripts_test.py [SOURCE_DIR]
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else \
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE, "bench"))

import attribute_profile  # noqa: E402
import flops  # noqa: E402
import memory_peak  # noqa: E402

LLAMA_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 32, "vocab_size": 32000}
PID = 4242
MAIN, AUTOGRAD = 1, 2


def op(name, ts, dur, tid=MAIN, dims=None, cat="cpu_op"):
    e = {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": {}}
    if dims:
        e["args"]["Input Dims"] = dims
    return e


def launch(corr, ts, tid=MAIN, name="cudaLaunchKernel", cat="cuda_runtime"):
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": 2,
            "args": {"correlation": corr}}


def kernel(corr, name, ts, dur, stream=7, device=0, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "device": device, "stream": stream}}


def gpu_trace():
    """One step of 1000 us; the expected attribution is in AttributeProfileTest."""
    base = [[8192, 4096], [4096, 4096]]
    ev = [
        op("qlora::step", 0, 1000, cat="user_annotation"),
        op("qlora::forward", 0, 300, cat="user_annotation"),
        op("aten::linear", 10, 40, dims=[[4, 2048, 4096], [4096, 4096]]),
        op("aten::mm", 20, 20, dims=base), launch(1, 30),
        op("aten::mm", 60, 20, dims=[[8192, 4096], [4096, 16]]), launch(2, 70),
        op("aten::_scaled_dot_product_flash_attention", 100, 50, dims=[[4, 32, 2048, 128]]), launch(3, 110),
        launch(4, 160),  # the dequantize kernel, launched outside any op
        op("aten::rms_norm", 170, 20, dims=[[4, 2048, 4096], [4096]]), launch(5, 180),
        op("qlora::loss", 300, 100, cat="user_annotation"),
        op("aten::mm", 305, 20, dims=[[8192, 4096], [4096, 32000]]), launch(6, 310),
        op("qlora::backward", 400, 400, cat="user_annotation"),
        op("autograd::engine::evaluate_function: qlora::engine::CheckpointBackward", 410, 290, tid=AUTOGRAD),
        op("qlora::engine::CheckpointBackward", 410, 290, tid=AUTOGRAD),
        op("aten::mm", 420, 10, tid=AUTOGRAD, dims=base), launch(7, 425, tid=AUTOGRAD),
        op("autograd::engine::evaluate_function: MmBackward0", 500, 100, tid=AUTOGRAD),
        op("MmBackward0", 500, 100, tid=AUTOGRAD),
        op("aten::mm", 540, 20, tid=AUTOGRAD, dims=base), launch(8, 550, tid=AUTOGRAD),
        op("qlora::optimizer", 800, 100, cat="user_annotation"),
        op("aten::lerp_", 805, 10, dims=[[1000], [1000]]), launch(9, 810),
        launch(10, 820, name="cuLaunchKernelEx", cat="cuda_driver"),
        launch(11, 950, name="cudaMemcpyAsync"),
        # device 0
        kernel(1, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 100, 100),
        kernel(2, "nvjet_hsh_64x8_64x16_2x1_v_bz_coopA_NNT", 200, 10),
        kernel(3, "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", 210, 50),
        kernel(4, "void qlora::kernels::Dequantize4bitKernel<__nv_bfloat16>", 260, 20),
        kernel(5, "void at::native::(anonymous namespace)::vectorized_elementwise_kernel<4, rms>", 280, 10),
        kernel(6, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", 350, 100),
        kernel(7, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 450, 100),
        kernel(8, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64", 550, 100),
        kernel(9, "void at::native::vectorized_elementwise_kernel<4, lerp_functor>", 820, 40),
        kernel(10, "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 840, 60, stream=20),
        kernel(11, "Memcpy DtoH (Device -> Pinned)", 950, 10, cat="gpu_memcpy"),
        # device 1 holds less: not the one analysed
        kernel(99, "sm90_xmma_gemm_other_device", 0, 5, device=1),
    ]
    return {"traceEvents": ev}


class AttributeProfileTest(unittest.TestCase):
    def setUp(self):
        self.res = attribute_profile.analyse(gpu_trace()["traceEvents"], r=16, vocab=32000)

    def test_every_row_of_the_known_trace(self):
        c = self.res["categories"]
        expected = {"base_gemm": 300, "lora_gemm": 10, "attention": 50, "dequant": 20, "ew_norm": 10, "loss": 100,
                    "optimizer": 40, "collective": 40, "copies": 10, "idle": 420}
        for key, us in expected.items():
            self.assertAlmostEqual(c[key], us, places=6, msg=key)
        for key, us in c.items():
            if key not in expected:
                self.assertEqual(us, 0, key)
        self.assertAlmostEqual(sum(c.values()), 1000, places=6)
        self.assertEqual(self.res["steps"], 1)
        self.assertAlmostEqual(self.res["step_ms"], 1.0)
        self.assertAlmostEqual(self.res["collectives_total_us"], 60)
        self.assertEqual(self.res["mode"], "GPU 0")

    def test_base_weight_copies_count_where_the_gpu_waits_for_them(self):
        # A layer copied from host memory in the forward: 60 us of copy, 40 of them under a GEMM
        # (overlapped: the GEMM's), 20 alone (the GPU waiting for the layer: the store's).
        ev = [
            op("qlora::step", 0, 200, cat="user_annotation"),
            op("qlora::forward", 0, 200, cat="user_annotation"),
            op("qlora::base_weights", 5, 10, cat="user_annotation"), launch(1, 8, name="cudaMemcpyAsync"),
            op("aten::mm", 20, 10, dims=[[8192, 4096], [4096, 4096]]), launch(2, 25),
            kernel(1, "Memcpy HtoD (Pinned -> Device)", 20, 60, stream=30, cat="gpu_memcpy"),
            kernel(2, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 20, 40),
        ]
        c = attribute_profile.analyse(ev, r=16, vocab=32000)["categories"]
        self.assertAlmostEqual(c["base_weights"], 20, places=6)
        self.assertAlmostEqual(c["base_gemm"], 40, places=6)
        self.assertAlmostEqual(c["copies"], 0, places=6)

    def test_phases_by_launch_with_the_recompute_told_apart(self):
        p = self.res["phases"]
        self.assertAlmostEqual(p["forward"], 190)
        self.assertAlmostEqual(p["loss"], 100)
        self.assertAlmostEqual(p["recompute"], 100)
        self.assertAlmostEqual(p["backward"], 100)
        self.assertAlmostEqual(p["optimizer"], 80)  # AdamW and the exposed reduce-scatter
        self.assertAlmostEqual(p["step (other)"], 10)

    def test_report_and_command_line(self):
        text = attribute_profile.report(self.res, "fixture")
        self.assertIn("| base GEMMs | 0.3 | 30.0 | 3 |", text)
        self.assertIn("| host gaps (GPU idle) | 0.4 | 42.0 |  |", text)
        self.assertIn("| **step** | **1.0** | **100.0** |", text)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            with open(path, "w") as f:
                json.dump(gpu_trace(), f)
            config = os.path.join(d, "config.json")
            with open(config, "w") as f:
                json.dump(LLAMA_7B, f)
            out = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "attribute_profile.py"), path,
                                  "--config", config, "--json", os.path.join(d, "a.json")],
                                 capture_output=True, text=True, check=True).stdout
            self.assertIn("| loss (incl. lm_head GEMMs) | 0.1 | 10.0 | 1 |", out)
            with open(os.path.join(d, "a.json")) as f:
                self.assertAlmostEqual(json.load(f)["categories"]["idle"], 420)

    def test_short_idle_spans_between_kernels_are_bubbles_not_host_gaps(self):
        # The attention kernel starts 2 us after the rank-r GEMM ends: the GPU's switch between
        # kernels, not the host.
        ev = gpu_trace()["traceEvents"]
        for e in ev:
            if e.get("cat") == "kernel" and "flash_fwd" in e["name"]:
                e["ts"], e["dur"] = 212, 48
        res = attribute_profile.analyse(ev, r=16, vocab=32000)
        self.assertAlmostEqual(res["categories"]["bubble"], 2)
        self.assertAlmostEqual(res["categories"]["attention"], 48)
        self.assertAlmostEqual(res["categories"]["idle"], 420)
        self.assertIn("| kernel bubbles (idle < 5 us between items) | 0.0 | 0.2 |  |",
                      attribute_profile.report(res, "fixture"))

    def test_work_launched_inside_a_lora_range_is_lora_whatever_its_shapes(self):
        # Ours' rank-r GEMMs run inside its autograd nodes, whose ops show the layer's shapes:
        # the engine marks them with a qlora::lora range, which is no phase of its own.
        ev = gpu_trace()["traceEvents"]
        ev.append(op("qlora::lora", 545, 10, tid=AUTOGRAD, cat="user_annotation"))  # launch 8
        res = attribute_profile.analyse(ev, r=16, vocab=32000)
        self.assertAlmostEqual(res["categories"]["lora_gemm"], 110)
        self.assertAlmostEqual(res["categories"]["base_gemm"], 200)
        self.assertAlmostEqual(res["phases"]["backward"], 100)
        self.assertAlmostEqual(res["phases"]["recompute"], 100)
        ev.append(op("qlora::lora", 175, 10, cat="user_annotation"))  # launch 5, not a GEMM
        res = attribute_profile.analyse(ev, r=16, vocab=32000)
        self.assertAlmostEqual(res["categories"]["lora_other"], 10)
        self.assertAlmostEqual(res["categories"]["ew_norm"], 0)

    def test_steps_cut_by_the_profiler_are_whole_or_left_out(self):
        # Ours' profiler switches on inside the first step's qlora::step range and off inside the
        # next step's: the first range is missing, a cut one (GPU idle) follows the last step.
        ev = [e for e in gpu_trace()["traceEvents"] if e["name"] != "qlora::step"]
        ev += [op("qlora::step", 1000, 300, cat="user_annotation"),
               op("qlora::forward", 1000, 100, cat="user_annotation")]
        res = attribute_profile.analyse(ev, r=16, vocab=32000)
        self.assertEqual(res["steps"], 1)
        self.assertAlmostEqual(res["window_us"], 900)  # first forward to the optimizer's end
        self.assertAlmostEqual(res["categories"]["idle"], 330)

    def test_a_trace_without_steps_is_read_whole(self):
        ev = [e for e in gpu_trace()["traceEvents"] if not e["name"].startswith("qlora::")]
        res = attribute_profile.analyse(ev, r=16, vocab=32000)
        self.assertEqual(res["steps"], 1)
        self.assertAlmostEqual(res["window_us"], 960 - 100)  # first to last GPU activity
        self.assertAlmostEqual(res["phases"]["outside"],
                               sum(v for k, v in res["categories"].items() if k not in ("idle", "bubble")))


def events(ranks, steps, step_s, mb=4, seq=2048, whole_responses=True):
    """Progress as older builds of `qloractl watch -o json` printed it, each WatchJob response
    whole (int64 fields as strings, zero fields left out), which the tests below edit; without
    whole_responses, as it prints it now: a "state" line per state change and a "step" line per
    optimizer step with every rank's report (cli/event_json.h). Rank r's steps take step_s[r]
    seconds each."""
    def report(s, r):
        return {"rank": r, "step": s, "elapsed_seconds": 2.0 + s * step_s[r],
                "tokens_per_second": mb * seq / step_s[r],
                "memory": {"device_peak_bytes": (7 + r) * 2**30 + s, "device_reserved_peak_bytes": 8 * 2**30}}
    if not whole_responses:
        lines = [{"type": "state", "state": "JOB_STATE_RUNNING"}]
        lines += [{"type": "step", "step": s, "ranks": [report(s, r) for r in range(ranks)]}
                  for s in range(1, steps + 1)]
        lines.append({"type": "state", "state": "JOB_STATE_SUCCEEDED"})
        return "\n".join(json.dumps(x) for x in lines) + "\n"
    lines = [{"job": {"state": "JOB_STATE_RUNNING"}, "event": {"state": "JOB_STATE_RUNNING"}}]
    for s in range(1, steps + 1):
        for r in range(ranks):
            prog = report(s, r)
            prog["step"] = str(s)
            prog["memory"] = {k: str(v) for k, v in prog["memory"].items()}
            if not r:
                del prog["rank"]
            lines.append({"job": {"state": "JOB_STATE_RUNNING"}, "event": {"progress": prog}})
    lines.append({"job": {"state": "JOB_STATE_SUCCEEDED"}, "event": {"state": "JOB_STATE_SUCCEEDED"}})
    return "\n".join(json.dumps(x) for x in lines) + "\n"


def fair_summary(rows, parts=None, smi=None):
    """bench/fair_summary.py's report for these results.jsonl rows (and parts.jsonl rows and
    nvidia-smi CSV text, when given)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "results.jsonl")
        with open(path, "w") as f:
            f.write("\n".join(json.dumps(r) for r in rows) + "\n")
        args = [sys.executable, os.path.join(SOURCE, "bench", "fair_summary.py"), path]
        if parts is not None:
            args += ["--parts", os.path.join(d, "parts.jsonl")]
            with open(args[-1], "w") as f:
                f.write("\n".join(json.dumps(q) for q in parts) + "\n")
        if smi is not None:
            args += ["--smi", os.path.join(d, "smi.csv")]
            with open(args[-1], "w") as f:
                f.write(smi)
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout


class SummarizeTest(unittest.TestCase):
    def run_summarize(self, text, *args):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "events.jsonl")
            with open(path, "w") as f:
                f.write(text)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(LLAMA_7B, f)
            out = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "summarize.py"), path, "--model", d]
                                 + list(args), capture_output=True, text=True, check=True)
            return json.loads(out.stdout.splitlines()[0]), out.stderr

    def test_older_whole_responses_read_the_same(self):
        args = ("--gpus", "0,1", "--micro-batch", "4", "--warmup", "3", "--windows", "3", "--window-steps", "5")
        new, _ = self.run_summarize(events(2, 20, [0.8, 0.9], whole_responses=False), *args)
        old, _ = self.run_summarize(events(2, 20, [0.8, 0.9]), *args)
        del new["model"], old["model"]  # their temporary folders
        self.assertEqual(new, old)
        self.assertEqual(new["state"], "JOB_STATE_SUCCEEDED")
        self.assertEqual(new["peak_allocated_gib_per_rank"], {"0": 7.0, "1": 8.0})

    def test_windows_of_tokens_over_wall_time_with_mfu_from_the_config(self):
        got, table = self.run_summarize(events(2, 20, [0.8, 0.8]), "--gpus", "0,1", "--micro-batch", "4",
                                        "--warmup", "3", "--windows", "3", "--window-steps", "5")
        self.assertEqual(got["state"], "JOB_STATE_SUCCEEDED")
        self.assertAlmostEqual(got["tokens_per_s"], 4 * 2048 / 0.8, places=0)
        self.assertEqual(len(got["window_tokens_per_s"]), 3)
        self.assertAlmostEqual(got["step_time_s"], 0.8, places=4)
        self.assertEqual(got["peak_allocated_gib_per_rank"], {"0": 7.0, "1": 8.0})
        self.assertEqual(got["peak_allocated_gib"], 8.0)
        self.assertEqual(got["peak_reserved_gib"], 8.0)
        f = flops.flops_per_token(LLAMA_7B, 2048, 16, True)
        self.assertAlmostEqual(got["mfu"], round(got["tokens_per_s"] * f["model"] / flops.PEAK_BF16_FLOPS, 4))
        self.assertIn("| ours | 2 GPU | mb 4 | ZeRO-2 | 10,240 tok/s/GPU", table)

    def test_the_rate_is_tokens_over_wall_time_not_a_mean_of_rates(self):
        # A slow rank sets the pace of the windows; the per-step mean is shown beside it.
        text = events(1, 9, [1.0])
        lines = text.splitlines()
        # step 5 takes 3 s instead of 1 (every later elapsed time moves by 2 s)
        fixed = []
        for line in lines:
            m = json.loads(line)
            prog = m["event"].get("progress")
            if prog and int(prog["step"]) >= 5:
                prog["elapsed_seconds"] += 2.0
                if int(prog["step"]) == 5:
                    prog["tokens_per_second"] = 4 * 2048 / 3.0
            fixed.append(json.dumps(m))
        got, _ = self.run_summarize("\n".join(fixed) + "\n", "--micro-batch", "4", "--warmup", "1",
                                    "--windows", "1", "--window-steps", "8")
        self.assertAlmostEqual(got["tokens_per_s"], 8 * 4 * 2048 / 10.0, places=0)
        self.assertAlmostEqual(got["mean_of_per_step_rates"], (7 * 8192 + 8192 / 3) / 8, places=0)

    @staticmethod
    def with_checkpointing(text, report):
        """The events of `text` with `report` as every progress event's checkpointing report."""
        lines = []
        for line in text.splitlines():
            m = json.loads(line)
            if m["event"].get("progress"):
                m["event"]["progress"]["checkpointing"] = dict(report)
            lines.append(json.dumps(m))
        return "\n".join(lines) + "\n"

    def test_auto_checkpointing_reports_the_split_and_counts_its_recompute(self):
        text = self.with_checkpointing(events(1, 9, [1.0]), {
            "checkpointed_layers": "17", "layers": "32",
            "planned_peak_bytes": str(21 * 2**30), "budget_bytes": str(24 * 2**30)})
        got, _ = self.run_summarize(text, "--micro-batch", "4", "--warmup", "1",
                                    "--windows", "1", "--window-steps", "8", "--checkpointing", "auto",
                                    "--max-memory-gib", "24")
        self.assertEqual(got["checkpointing"], "auto")
        self.assertEqual(got["checkpointed_layers"], [17])
        self.assertEqual(got["layers"], 32)
        self.assertEqual(got["max_memory_gib"], 24.0)
        self.assertEqual(got["planned_peak_gib"], [21.0])
        f = flops.flops_per_token(LLAMA_7B, 2048, 16, 17 / 32)
        self.assertAlmostEqual(got["hfu"], round(got["tokens_per_s"] * f["hardware"] / flops.PEAK_BF16_FLOPS, 4))

    def test_offloaded_layers_the_workers_report_are_not_recomputed(self):
        # offload_activation_layers: auto: the count comes from the progress reports.
        text = self.with_checkpointing(events(1, 9, [1.0]), {
            "checkpointed_layers": "14", "layers": "32", "offloaded_layers": "7",
            "planned_peak_bytes": str(21 * 2**30), "budget_bytes": str(24 * 2**30)})
        got, _ = self.run_summarize(text, "--micro-batch", "4", "--warmup", "1",
                                    "--windows", "1", "--window-steps", "8", "--checkpointing", "auto",
                                    "--max-memory-gib", "24", "--offloaded-layers", "auto")
        self.assertEqual(got["recomputed_fraction"], round((14 - 7) / 32, 4))
        self.assertEqual(got["offloaded_layers"], [7])
        self.assertIn("7 of 32 layers offloaded (auto)", got["variant"])
        # A count in the job file, with workers that report none (older ones): the count.
        got, _ = self.run_summarize(events(1, 9, [1.0]), "--micro-batch", "4", "--warmup", "1",
                                    "--windows", "1", "--window-steps", "8", "--checkpointing", "true",
                                    "--offloaded-layers", "12")
        self.assertEqual(got["recomputed_fraction"], round(1 - 12 / 32, 4))
        self.assertIn("12 of 32 layers offloaded", got["variant"])

    def test_fp8_runs_name_their_compute_in_the_variant(self):
        got, _ = self.run_summarize(events(1, 9, [1.0]), "--micro-batch", "4", "--warmup", "1",
                                    "--windows", "1", "--window-steps", "8", "--float8", "1")
        self.assertIn("nf4-dq+fp8 forward", got["variant"])
        got, _ = self.run_summarize(events(1, 9, [1.0]), "--micro-batch", "4", "--warmup", "1",
                                    "--windows", "1", "--window-steps", "8")
        self.assertIn("nf4-dq+bf16", got["variant"])

    def test_dequantized_layers_name_the_variant(self):
        # dequantized_weight_layers: auto, its choice from the worker log; a count as it is.
        got, _ = self.run_summarize(events(1, 9, [1.0]), "--micro-batch", "4", "--warmup", "1",
                                    "--windows", "1", "--window-steps", "8", "--checkpointing", "false",
                                    "--max-memory-gib", "36", "--dequantized-layers", "auto:9")
        self.assertIn("weights of 9 layers held dequantized (auto)", got["variant"])
        self.assertEqual(got["recomputed_fraction"], 0.0)
        got, _ = self.run_summarize(events(1, 9, [1.0]), "--micro-batch", "4", "--warmup", "1",
                                    "--windows", "1", "--window-steps", "8", "--dequantized-layers", "4")
        self.assertIn("weights of 4 layers held dequantized", got["variant"])
        self.assertNotIn("(auto)", got["variant"])
        # Workers that report the count: theirs wins over the log's.
        text = self.with_checkpointing(events(1, 9, [1.0]), {"layers": "32", "dequantized_layers": "11"})
        got, _ = self.run_summarize(text, "--micro-batch", "4", "--warmup", "1", "--windows", "1",
                                    "--window-steps", "8", "--checkpointing", "false",
                                    "--dequantized-layers", "auto:?")
        self.assertIn("weights of 11 layers held dequantized (auto)", got["variant"])

    def test_fair_summary_compares_auto_with_the_best_anchor_within_its_budget(self):
        rows = [
            {"impl": "ours", "checkpointing": "auto", "max_memory_gib": 24.0, "checkpointed_layers": [17],
             "layers": 32, "gpus": 1, "micro_batch": 4, "tokens_per_s": 14000.0, "peak_allocated_gib": 21.0},
            {"impl": "hf", "anchor": "bitsandbytes", "liger": True, "checkpointing": True, "gpus": 1,
             "micro_batch": 4, "tokens_per_s": 10000.0, "peak_allocated_gib": 7.5},
            {"impl": "hf", "anchor": "bitsandbytes", "liger": True, "checkpointing": False, "gpus": 1,
             "micro_batch": 4, "tokens_per_s": 15000.0, "peak_allocated_gib": 36.8},
        ]
        out = fair_summary(rows)
        auto = [line for line in out.splitlines() if "auto, 24.0 GiB budget" in line]
        self.assertEqual(len(auto), 2, out)  # ours and the checkpointing anchor; the 36.8 GiB one does not fit
        self.assertIn("17 of 32 layers checkpointed", auto[0])
        self.assertTrue(auto[0].rstrip().endswith("| 1.40x |"), auto[0])
        self.assertIn("(checkpointing)", auto[1])

    def test_fair_summary_gives_ours_over_unsloth_in_a_column_where_unsloth_ran(self):
        rows = [
            {"impl": "ours", "checkpointing": True, "gpus": 1, "micro_batch": 4, "tokens_per_s": 14000.0},
            {"impl": "unsloth", "unsloth_gc": "unsloth", "checkpointing": True, "gpus": 1, "micro_batch": 4,
             "tokens_per_s": 11200.0, "versions": {"unsloth": "2026.10.9"}},
            {"impl": "hf", "anchor": "bitsandbytes", "liger": True, "checkpointing": True, "gpus": 1,
             "micro_batch": 4, "tokens_per_s": 10000.0},
            {"impl": "ours", "checkpointing": True, "gpus": 1, "micro_batch": 1, "tokens_per_s": 12000.0},
        ]
        out = fair_summary(rows)
        self.assertIn("| vs best anchor | vs Unsloth |", out)
        mb4 = [line for line in out.splitlines() if "mb 4" in line]
        self.assertTrue(mb4[0].endswith("| 1.25x | 1.25x |"), mb4[0])  # ours over Unsloth, the best anchor
        self.assertTrue(mb4[1].endswith("| best anchor | Unsloth |"), mb4[1])
        self.assertTrue(mb4[2].endswith("| 0.89x | 0.89x |"), mb4[2])
        mb1 = [line for line in out.splitlines() if "mb 1" in line]
        self.assertTrue(mb1[0].endswith("|  | — |"), mb1[0])  # no Unsloth in that setting
        self.assertIn("Unsloth 2026.10.9", out)
        # Results without Unsloth read as before: no such column.
        self.assertNotIn("Unsloth", fair_summary([rows[0], rows[2]]))

    def test_fair_summary_gives_each_part_the_clock_it_held_while_busy(self):
        # nvidia-smi's samples as run_on_gpu.sh writes them: per part, the median SM clock and
        # power of the samples inside its times with the GPU busy (> 90 %); loading (idle) and
        # other parts' samples do not count, a part with none is left blank.
        smi = "\n".join([
            "index, timestamp, clocks.current.sm [MHz], power.draw [W], temperature.gpu, utilization.gpu [%], "
            "clocks_event_reasons.active",
            "0, 2026/12/02 16:00:00.000, 1980 MHz, 90.00 W, 40, 0 %, 0x0000000000000001",
            "0, 2026/12/02 16:00:01.000, 1515 MHz, 699.10 W, 60, 100 %, 0x0000000000000004",
            "0, 2026/12/02 16:00:02.000, 1530 MHz, 700.20 W, 61, 100 %, 0x0000000000000004",
            "0, 2026/12/02 16:00:03.000, 1545 MHz, 698.00 W, 62, 98 %, 0x0000000000000004",
            "0, 2026/12/02 16:00:04.000, 1980 MHz, 120.00 W, 55, 3 %, 0x0000000000000001",
            "0, 2026/12/02 16:00:05.000, 1590 MHz, 690.00 W, 63, 100 %, 0x0000000000000004",
            "0, 2026/12/02 16:00:06.000, [N/A], [N/A], 63, 100 %, [N/A]",
            "0, 2026/12/02 16:00:07.000, 1610",
        ]) + "\n"
        parts = [
            {"part": "ours-mb4-nockpt", "rc": 0, "seconds": 5, "note": "",
             "started": "2026/12/02 16:00:00.000", "ended": "2026/12/02 16:00:04.500"},
            {"part": "liger", "rc": 0, "seconds": 3, "note": "",
             "started": "2026/12/02 16:00:04.500", "ended": "2026/12/02 16:00:07.500"},
            {"part": "attr-liger", "rc": 0, "seconds": 1, "note": "",
             "started": "2026/12/02 16:00:08.000", "ended": "2026/12/02 16:00:09.000"},
        ]
        rows = [{"impl": "ours", "gpus": 1, "micro_batch": 4, "tokens_per_s": 19000.0, "part": "ours-mb4-nockpt"}]
        out = fair_summary(rows, parts, smi)
        self.assertIn("| ours-mb4-nockpt | 0 | 5 | 1,530 MHz (3 samples) | 699 W |", out)
        self.assertIn("| liger | 0 | 3 | 1,590 MHz (1 sample) | 690 W |", out)
        self.assertIn("| attr-liger | 0 | 1 |  |  |", out)
        # Without samples (no SMI_LOG), the parts' table as before.
        self.assertIn("| ours-mb4-nockpt | 0 | 5 |  |", fair_summary(rows, parts))
        self.assertNotIn("SM clock", fair_summary(rows, parts))

    def test_fair_summary_keeps_models_and_row_lengths_apart(self):
        seven, slice70 = "/dev/shm/llama7b", "/dev/shm/llama70b-slice"
        rows = [
            {"impl": "ours", "model": seven, "seq": 2048, "gpus": 1, "micro_batch": 4, "tokens_per_s": 13000.0},
            {"impl": "hf", "anchor": "bitsandbytes", "liger": True, "model": seven, "seq": 2048, "gpus": 1,
             "micro_batch": 4, "tokens_per_s": 10000.0},
            {"impl": "ours", "model": slice70, "seq": 2048, "gpus": 1, "micro_batch": 4, "tokens_per_s": 15000.0},
            {"impl": "hf", "anchor": "bitsandbytes", "liger": True, "model": slice70, "seq": 2048, "gpus": 1,
             "micro_batch": 4, "tokens_per_s": 12000.0},
            {"impl": "ours", "model": seven, "seq": 8192, "packing": True, "gpus": 1, "micro_batch": 1,
             "tokens_per_s": 11000.0},
        ]
        out = fair_summary(rows)
        lines = [line for line in out.splitlines() if line.startswith("| ") and ", mb " in line]
        self.assertTrue(lines[0].startswith("| 1 GPU, mb 4, checkpointing | **ours**"), out)
        self.assertTrue(lines[0].rstrip().endswith("| 1.30x |"), lines[0])
        slice_rows = [line for line in lines if line.startswith("| llama70b-slice, 1 GPU, mb 4")]
        self.assertEqual(len(slice_rows), 2, out)
        self.assertTrue(slice_rows[0].rstrip().endswith("| 1.25x |"), slice_rows[0])
        self.assertTrue(any(line.startswith("| packed rows of 8192, 1 GPU, mb 1") for line in lines), out)

    def test_packed_rows_count_their_non_padding_tokens(self):
        # Rows 90% full: each step's rate counts non-padding tokens; no MFU (attention per document).
        text = events(1, 9, [1.0]).replace(f'"tokens_per_second": {4 * 2048 / 1.0}',
                                           f'"tokens_per_second": {0.9 * 4 * 2048}')
        got, table = self.run_summarize(text, "--micro-batch", "4", "--warmup", "1", "--windows", "2",
                                        "--window-steps", "4", "--packing", "true")
        self.assertTrue(got["packing"])
        self.assertAlmostEqual(got["tokens_per_s"], 0.9 * 4 * 2048, places=0)
        self.assertAlmostEqual(got["row_fill"], 0.9, places=4)
        self.assertNotIn("mfu", got)
        self.assertIn("| ours | 1 GPU | mb 4 | seq 2048 packed (90.0% full) | ZeRO-2 |", table)

    def test_a_missing_step_is_an_error(self):
        text = "\n".join(line for line in events(1, 9, [1.0]).splitlines() if '"step": "6"' not in line) + "\n"
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "events.jsonl")
            with open(path, "w") as f:
                f.write(text)
            run = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "summarize.py"), path, "--warmup", "1",
                                  "--windows", "1", "--window-steps", "5"], capture_output=True, text=True)
            self.assertNotEqual(run.returncode, 0)
            self.assertIn("no progress event at step", run.stderr)


class FairBenchScriptTest(unittest.TestCase):
    """bench/fair_bench.sh runs each part in a new shell (`bash -c`), which sees only the
    functions it exports: one left out fails its part on the GPU machine with status 127."""

    def test_every_function_a_part_runs_is_exported(self):
        import re
        with open(os.path.join(SOURCE, "bench", "fair_bench.sh")) as f:
            text = f.read()
        defined = set(re.findall(r"^([a-z_0-9]+)\(\) \{", text, re.M))
        exported = set()
        for block in re.findall(r"^export -f ((?:.*\\\n)*.*)$", text, re.M):
            exported |= set(block.replace("\\\n", " ").split())
        run_lines = [line for line in text.splitlines() if re.search(r"\brun_part\b", line)
                     and not line.lstrip().startswith(("#", "run_part()"))]
        used = {word for line in run_lines for word in re.findall(r"[a-z_0-9]+", line)} & defined
        used.discard("run_part")
        self.assertTrue(used, "no part's function found: the pattern no longer matches the script")
        self.assertEqual(sorted(used - exported), [])


class FlopsTest(unittest.TestCase):
    def test_llama_7b_matches_the_reference_figures(self):
        f = flops.flops_per_token(LLAMA_7B, 2048, 16, True)
        self.assertAlmostEqual(f["model"] / 1e9, 29.9, places=1)      # peers.md section 3, ~4N
        self.assertAlmostEqual(f["hardware"] / 1e9, 44.0, places=1)   # with full recompute, ~6N
        self.assertAlmostEqual(f["attention_forward"] / 1e9, 1.07, places=2)
        self.assertAlmostEqual((f["n_layers"] + f["n_head"]) / 1e9, 6.61, places=2)
        self.assertEqual(flops.flops_per_token(LLAMA_7B, 2048, 16, False)["hardware"], f["model"])

    def test_grouped_query_attention_and_head_dim_follow_the_config(self):
        gqa = dict(LLAMA_7B, num_key_value_heads=8)
        a, b = flops.flops_per_token(LLAMA_7B, 2048), flops.flops_per_token(gqa, 2048)
        self.assertEqual(a["n_layers"] - b["n_layers"], 32 * 2 * 4096 * (4096 - 1024))
        self.assertEqual(a["attention_forward"], b["attention_forward"])


def memory(ts, addr, size, total, tid=MAIN, device_type=1):
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": PID, "tid": tid, "ts": ts,
            "args": {"Device Type": device_type, "Addr": addr, "Bytes": size, "Total Allocated": total,
                     "Total Reserved": 4096}}


class MemoryPeakTest(unittest.TestCase):
    """1000 bytes allocated before the trace; inside it, A (100 B, forward) and B (200 B, in the
    recomputation) make the peak of 1300; A freed and C allocated after it; a CPU allocation is
    not counted."""

    def trace(self):
        return [
            op("qlora::forward", 0, 100, cat="user_annotation"),
            op("aten::mm", 5, 10),
            memory(10, "A", 100, 1100),
            op("qlora::backward", 100, 200, cat="user_annotation"),
            op("autograd::engine::evaluate_function: qlora::engine::CheckpointBackward", 110, 100, tid=AUTOGRAD),
            op("qlora::engine::CheckpointBackward", 110, 100, tid=AUTOGRAD),
            op("aten::empty", 115, 10, tid=AUTOGRAD),
            memory(120, "B", 200, 1300, tid=AUTOGRAD),
            memory(130, "X", 5000, 9999, device_type=0),
            memory(150, "A", -100, 1200),
            memory(160, "C", 50, 1250),
        ]

    def test_the_peak_its_phase_and_who_allocated_what_was_alive(self):
        r = memory_peak.analyse(self.trace())
        self.assertEqual(r["peak"], 1300)
        self.assertEqual(r["phase"], "recompute")
        self.assertEqual(r["ops"][-1], "aten::empty")
        self.assertEqual(r["in_trace"], 300)
        self.assertEqual(r["reserved"], 4096)
        self.assertEqual(dict(r["groups"]), {
            ("aten::mm", 100): [1, 100],
            ("qlora::engine::CheckpointBackward / aten::empty", 200): [1, 200],
        })

    def test_a_trace_without_memory_events_is_an_error(self):
        with self.assertRaises(SystemExit):
            memory_peak.analyse([op("aten::mm", 5, 10)])


if __name__ == "__main__":
    unittest.main()
