// Lint rules: typescript-eslint's recommended type-aware set, plus the project's own bans.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'build/', 'node_modules/', '.sandgym/', 'agent/', '.venv/'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      'no-console': 'error',
      '@typescript-eslint/consistent-type-imports': 'error',
      '@typescript-eslint/no-floating-promises': 'error',
      // a promise returned from a try or a `using` block escapes its catch and its disposal
      '@typescript-eslint/return-await': ['error', 'error-handling-correctness-only'],
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
    },
  },
  {
    files: ['src/cli/**', 'examples/**', 'benchmarks/**', 'scripts/**', 'test/**'],
    rules: { 'no-console': 'off' },
  },
  { files: ['eslint.config.js', '**/*.mjs'], ...tseslint.configs.disableTypeChecked },
);
