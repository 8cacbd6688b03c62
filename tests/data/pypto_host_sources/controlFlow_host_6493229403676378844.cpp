#define __TILE_FWK_AICPU__ 1
#include <stdint.h>
#include "expression_0.h"
#include "tilefwk/aikernel_data.h"
#include "tilefwk/aicpu_runtime.h"
#include "tilefwk/aicpu_distributed.h"
#include "control_flow_expr_table.h"
#define LOOP(idx, b, e, s) for (int64_t idx = (b), idxEnd = (e), idxStep = (s); idx < idxEnd; idx += idxStep)
namespace npu::tile_fwk {
// kernel/4cbe92d72ed476ac_8192.py:15
// #name: TENSOR_kernel #hash: 6493229403676378844 #magic: 2
__attribute__((section(".pypto.entry")))
uint64_t ControlFlowEntry(void *ctx, int64_t *symbolTable, RuntimeCallEntryType runtimeCallList[], DevStartArgsBase *startArgs) {
  // hash=4497217706533424183
  LOOP(VAR_loop_idx_0, 0, 1, 1) {
    VALUE_loop_idx_0 = VAR_loop_idx_0;
    // #name: TENSOR_default_loop_1_Unroll1_PATH0 #hash: 15669721966017181907 #magic: 4
      // <pypto>/frontend/parser/parser.py:871
      // #name: TENSOR_default_loop_1_Unroll1_PATH0_hiddenfunc0 #hash: 8285521396885270817 #magic: 5
      // #name: TENSOR_default_loop_1_Unroll1_PATH0_hiddenfunc0_root #hash: 4744505927618539971 #magic: 7
      uint64_t *exprList0 = (uint64_t *)RUNTIME_RootAlloc(0ULL);
      SetExprBatch_0_0(ctx, symbolTable, runtimeCallList, startArgs, exprList0);
      RUNTIME_RootStitch(0ULL);
  }
  RUNTIME_RootStitch(RUNTIME_FUNCKEY_FINISH); // Notify finish 
  return 0;
}
} // namespace npu::tile_fwk
