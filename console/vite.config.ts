import { defineConfig } from "vite";

// Served by the daemon under /ui/: every asset path is relative to it.
export default defineConfig({
  base: "/ui/",
  build: { outDir: "dist", emptyOutDir: true, assetsInlineLimit: 0, chunkSizeWarningLimit: 1024 },
});
