"""bertjax and the Hugging Face ecosystem: checkpoints exported to and
imported from transformers (hf_convert), and the SentencePiece tokenizer as
a transformers tokenizer (hf_tokenizer)."""
