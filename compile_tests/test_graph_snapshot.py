"""An inline snapshot of the compiled graph around verify.tree_attn_out.

A graph break or an extra copy of q or out shows up as a diff here.
"""

import pytest
import torch

from test_compile import VerifyAttention, inputs

expecttest = pytest.importorskip("expecttest")


def graph_targets(graph_module):
    return "\n".join(str(node.target) for node in graph_module.graph.nodes
                     if node.op == "call_function")


class TestCapturedGraph(expecttest.TestCase):
    def test_forward_graph_targets(self):
        from torch._functorch.aot_autograd import aot_module_simplified

        graphs = []

        def backend(gm, example_inputs):
            def fw_compiler(fx_module, _):
                graphs.append(fx_module)
                return fx_module.forward
            return aot_module_simplified(gm, example_inputs, fw_compiler=fw_compiler)

        torch._dynamo.reset()
        layer = VerifyAttention().requires_grad_(False)
        compiled = torch.compile(layer, backend=backend, fullgraph=True)
        compiled(*inputs(2, 0))
        assert len(graphs) == 1
        self.assertExpectedInline(graph_targets(graphs[0]), """\
aten.t.default
aten.mm.default
aten.slice.Tensor
aten.slice.Tensor
aten.view.default
aten.empty_like.default
auto_functionalized_v2
<built-in function getitem>
aten.t.default
aten.view.default
aten.mm.default""")
