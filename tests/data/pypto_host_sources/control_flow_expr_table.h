#pragma once
#include <cstdint>

namespace npu::tile_fwk {

void SetExprBatch_0_0(void *ctx, int64_t *symbolTable, RuntimeCallEntryType runtimeCallList[], DevStartArgsBase *startArgs, uint64_t *exprList);

} // namespace npu::tile_fwk
