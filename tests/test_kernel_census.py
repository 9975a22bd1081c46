"""benchmarks/_kernels.py: the kernel count that bench_user_jit records and the performance page
shows, on an optimised HLO module's text written here (what XLA prints, cut down)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))

import _kernels  # noqa: E402

MODULE = """HloModule jit_f, entry_computation_layout={(f64[4]{0})->f64[4]{0}}

FileNames
1 "/site-packages/jax/_src/numpy/ufuncs.py"
2 "/work/jaxrdp/mechanisms/sampled_gaussian/shared_nodes.py"

FunctionNames
1 "exp"
2 "_grid_nodes"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=2}
2 {file_name_id=2 function_name_id=2 line=42 end_line=42 column=3 end_column=9}

StackFrames
1 {file_location_id=2 parent_frame_id=1}
2 {file_location_id=1 parent_frame_id=1}

%fused_computation (param_0: f64[4]) -> f64[4] {
  %param_0 = f64[4]{0} parameter(0)
  ROOT %exp.1 = f64[4]{0} exponential(%param_0), metadata={op_name="exp" stack_frame_id=2}
}

%fused_computation.1 (param_0.1: f64[4]) -> f64[4] {
  %param_0.1 = f64[4]{0} parameter(0)
  ROOT %exp.2 = f64[4]{0} exponential(%param_0.1), metadata={op_name="exp" stack_frame_id=2}
}

%fused_computation.2 (param_0.2: f64[4]) -> f64[4] {
  %param_0.2 = f64[4]{0} parameter(0)
  ROOT %log.1 = f64[4]{0} log(%param_0.2)
}

%region_0.1 (a: f64[], b: f64[]) -> f64[] {
  %a = f64[] parameter(0)
  %b = f64[] parameter(1)
  ROOT %add = f64[] add(%a, %b)
}

%body (p: f64[4]) -> f64[4] {
  %p = f64[4]{0} parameter(0)
  ROOT %log_fusion = f64[4]{0} fusion(%p), kind=kLoop, calls=%fused_computation.2
}

ENTRY %main (x: f64[4]) -> f64[4] {
  %x = f64[4]{0} parameter(0)
  %exp_fusion = f64[4]{0} fusion(%x), kind=kLoop, calls=%fused_computation, metadata={op_name="exp" stack_frame_id=2}
  %exp_fusion.1 = f64[4]{0} fusion(%exp_fusion), kind=kLoop, calls=%fused_computation.1
  ROOT %while = f64[4]{0} while(%exp_fusion.1), condition=%cond, body=%body
}
"""


def test_each_distinct_fused_computation_is_one_kernel_of_the_computation_that_first_calls_it():
  # Two fusions of the same body (names and metadata aside) are compiled once; the reducer and
  # the fused computations themselves are not kernels.
  assert dict(_kernels.fusions(MODULE)) == {"body": 1, "entry": 1}


def test_sources_name_the_innermost_frame_inside_the_package():
  assert _kernels.sources(MODULE) == [
      ("body", "log_fusion", ""),
      ("entry", "exp_fusion", "mechanisms/sampled_gaussian/shared_nodes.py:_grid_nodes:42"),
      ("entry", "exp_fusion.1", "")]
