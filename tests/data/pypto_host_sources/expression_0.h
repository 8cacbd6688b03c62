#ifndef TILE_FWK_EXPRESSION_H
#define TILE_FWK_EXPRESSION_H

/* Function info EXPR_LOOP_BES_0: name=TENSOR_default_loop_1_Unroll1 hash=4497217706533424183 */

/* Function info EXPR_DEV_ROOT_COA_0: name=TENSOR_default_loop_1_Unroll1_PATH0_hiddenfunc0_root hash=4744505927618539971 */

/* Symbol table list */

#define INDEX_loop_idx_0 0
#define VALUE_loop_idx_0 (RUNTIME_GetSymbol(INDEX_loop_idx_0))

/* Input tensor list */
#define ARG_in0 0
#define ARG_in1 1
#define ARG_out0 2

/* Output tensor list */
#endif/*TILE_FWK_EXPRESSION_H*/
