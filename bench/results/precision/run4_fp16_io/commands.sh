#!/bin/bash
# force_fp16 with the float model inputs and outputs in fp16 (ATC's --input_fp16_nodes and
# --output_type FP16): each build's --json summary here, its blob in a temporary folder
OUT=$(mktemp -d)
cd "$(git rev-parse --show-toplevel)"
P=pypto-offline
C="--target kirin9050 --no-report --json"
run() { name=$1; shape=$2; fp16in=$3; $P $(python -c "from bench.platforms import source; print(source('$name')[0])") $shape $C -o $OUT/$name.ptom --precision_mode force_fp16 --input_fp16_nodes "$fp16in" --output_type FP16 > bench/results/precision/run4_fp16_io/$name.json 2> $OUT/$name.err; echo "$name $?"; }
run tf_vit "--input-shape pixel_values=1,3,32,32" "pixel_values"
run tf_convnext "--input-shape pixel_values=1,3,32,32" "pixel_values"
run tf_gpt2_decoder_kv "--input-shape input_ids=1,4 --input-shape attention_mask=1,16 --input-shape past_key_0=1,4,12,16 --input-shape past_value_0=1,4,12,16 --input-shape past_key_1=1,4,12,16 --input-shape past_value_1=1,4,12,16" "past_key_0;past_value_0;past_key_1;past_value_1"
run asr_frontend_whisper80_conv "--input-shape waveforms=1,16000 --input-shape waveforms_lens=1" "waveforms"
