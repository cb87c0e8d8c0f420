"""One module per API shape (chat completions, Responses, Anthropic Messages): how a request of
that shape reads into the library's neutral view and serializes back. Empty until the dialects
issue: the chat completions shape is still handled by proxy.compacting.chat.
"""
